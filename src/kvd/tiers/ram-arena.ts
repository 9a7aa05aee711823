/**
 * L2: the chunks that live in the shared arena. Owns the allocator, the per-class LRU,
 * leases (a GET pins a chunk until the client RELEASEs it, so the bytes it reads through
 * its own mapping cannot be overwritten underneath it) and PIN (soft pin with a TTL, or hard).
 */
import { ArenaAllocator, type Extent } from "../allocator.ts";
import type { ArenaMapping } from "../arena.ts";
import { ClassLru } from "../lru.ts";
import type { StoredClass } from "../types.ts";

export interface L2Entry {
  id: string;
  ns: string;
  key: string;
  ext: Extent;
  size: number;
  cls: StoredClass;
  /** 0 = no TTL. */
  expiresAt: number;
  /** Outstanding GET leases and internal readers (write-through, demotion). */
  leases: number;
  /** PIN: 0 = not pinned, Infinity = hard pin, else pinned until this time. */
  pinnedUntil: number;
  /** Removed from the index while still leased: freed on the last release. */
  deleted: boolean;
  /** A copy exists on L3 (write-through finished or read from there). */
  onDisk: boolean;
}

export class RamArenaTier {
  readonly arena: ArenaMapping;
  readonly entries = new Map<string, L2Entry>();
  readonly alloc: ArenaAllocator;
  private readonly lru = new ClassLru();
  private storedBytes = 0;
  evictions: Record<StoredClass, number> = { short: 0, long: 0 };

  constructor(arena: ArenaMapping) {
    this.arena = arena;
    this.alloc = new ArenaAllocator(arena.bytes);
  }

  get bytes(): number {
    return this.storedBytes;
  }

  view(e: { ext: Extent; size: number }): Buffer {
    return this.arena.buf.subarray(e.ext.offset, e.ext.offset + e.size);
  }

  /** A live entry (not deleted, not expired). Expired ones are removed on the way. */
  live(id: string, now = Date.now()): L2Entry | undefined {
    const e = this.entries.get(id);
    if (!e) return undefined;
    if (e.expiresAt !== 0 && e.expiresAt <= now) {
      this.remove(id);
      return undefined;
    }
    return e;
  }

  touch(e: L2Entry): void {
    this.lru.touch(e.id, e.cls);
  }

  insert(e: L2Entry): void {
    this.entries.set(e.id, e);
    this.lru.add(e.id, e.cls);
    this.storedBytes += e.size;
  }

  /**
   * Allocates `size` bytes, evicting when needed: expired chunks first, then `short` LRU,
   * then `long` LRU, never a leased or pinned one. `onEvict` runs before a victim's bytes
   * are freed (the store copies out what must be demoted to L3).
   */
  allocate(size: number, onEvict: (e: L2Entry, bytes: Buffer) => void): Extent | null {
    let ext = this.alloc.alloc(size);
    if (ext) return ext;
    const now = Date.now();
    if (this.sweep(now) > 0) ext = this.alloc.alloc(size);
    if (ext) return ext;
    for (const [id, cls] of this.lru.victims()) {
      const e = this.entries.get(id);
      if (!e || e.leases > 0 || this.isPinned(e, now)) continue;
      onEvict(e, this.view(e));
      this.remove(id);
      this.evictions[cls]++;
      ext = this.alloc.alloc(size);
      if (ext) return ext;
    }
    return null;
  }

  isPinned(e: L2Entry, now = Date.now()): boolean {
    return e.pinnedUntil > now;
  }

  /** Drops from the index; the bytes are freed now, or on the last release if leased. */
  remove(id: string): boolean {
    const e = this.entries.get(id);
    if (!e) return false;
    this.entries.delete(id);
    this.lru.remove(id);
    this.storedBytes -= e.size;
    e.deleted = true;
    if (e.leases === 0) this.alloc.free(e.ext);
    return true;
  }

  acquire(e: L2Entry): void {
    e.leases++;
  }

  release(e: L2Entry): void {
    if (e.leases <= 0) return;
    e.leases--;
    if (e.leases === 0 && e.deleted) this.alloc.free(e.ext);
  }

  /** Removes expired, unleased chunks (leased ones are marked and freed on release). */
  sweep(now = Date.now()): number {
    let n = 0;
    for (const [id, e] of this.entries) {
      if (e.expiresAt !== 0 && e.expiresAt <= now) {
        this.remove(id);
        n++;
      }
    }
    return n;
  }
}
