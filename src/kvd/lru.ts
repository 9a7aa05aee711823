import { EVICTION_ORDER, type StoredClass } from "./types.ts";

/**
 * LRU within a retention class. A JS Map iterates in insertion order, so deleting and
 * re-inserting on touch keeps the least recently used id first; eviction walks `short`
 * before `long`, so a `long` chunk is only evicted when no evictable `short` one is left.
 */
export class ClassLru {
  private readonly lists: Record<StoredClass, Map<string, true>> = { short: new Map(), long: new Map() };

  add(id: string, cls: StoredClass): void {
    this.remove(id);
    this.lists[cls].set(id, true);
  }

  touch(id: string, cls: StoredClass): void {
    const l = this.lists[cls];
    if (l.delete(id)) l.set(id, true);
  }

  remove(id: string): void {
    this.lists.short.delete(id);
    this.lists.long.delete(id);
  }

  /** Ids in eviction order: short LRU→MRU, then long LRU→MRU. */
  *victims(): Generator<[string, StoredClass]> {
    for (const cls of EVICTION_ORDER) for (const id of [...this.lists[cls].keys()]) yield [id, cls];
  }
}
