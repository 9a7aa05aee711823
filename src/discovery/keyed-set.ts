/**
 * The live worker set of a key-value registry (etcd), kept per *registry key* and presented
 * per *worker id*. Two keys may carry the same id (a worker re-registered under another model,
 * a copied record, a stale key from an older launcher): the set keeps both and shows one.
 *
 * Which one: the record whose key was created first (lowest etcd create revision; the key
 * name breaks ties). The first registrant keeps its place while a later duplicate appears and
 * goes; when the shown key is deleted the other one is shown in its place, so deleting a
 * duplicate can never remove a valid worker (before, deleting either key dropped the id).
 */
import type { DiscoveryEvent, WorkerRecord } from "./types.ts";

interface Entry {
  key: string;
  record: WorkerRecord;
  /** etcd create_revision; 0 where unknown. */
  createRevision: bigint;
}

export class KeyedWorkerSet {
  private readonly emit: (ev: DiscoveryEvent) => void;
  private readonly byKey = new Map<string, Entry>();
  /** id → the keys that carry it. */
  private readonly keysOfId = new Map<string, Set<string>>();
  /** id → the entry shown for it. */
  private readonly shown = new Map<string, Entry>();
  private snapshot: readonly WorkerRecord[] | null = null;

  constructor(emit: (ev: DiscoveryEvent) => void) {
    this.emit = emit;
  }

  get size(): number {
    return this.shown.size;
  }

  keys(): string[] {
    return [...this.byKey.keys()];
  }

  workers(): readonly WorkerRecord[] {
    this.snapshot ??= [...this.shown.values()].map((e) => e.record);
    return this.snapshot;
  }

  /** Puts (or replaces) the record stored under `key`. */
  set(key: string, record: WorkerRecord, createRevision: bigint): void {
    const prev = this.byKey.get(key);
    const entry: Entry = { key, record, createRevision };
    this.byKey.set(key, entry);
    if (prev && prev.record.id !== record.id) {
      this.unlink(prev.record.id, key);
      this.resolve(prev.record.id);
    }
    let ks = this.keysOfId.get(record.id);
    if (!ks) {
      ks = new Set();
      this.keysOfId.set(record.id, ks);
    }
    ks.add(key);
    this.resolve(record.id);
  }

  /** Removes whatever is stored under `key` (no-op when nothing is). */
  remove(key: string): void {
    const prev = this.byKey.get(key);
    if (!prev) return;
    this.byKey.delete(key);
    this.unlink(prev.record.id, key);
    this.resolve(prev.record.id);
  }

  /** Keys that carry `id`, when more than one does (for a warning). */
  duplicates(id: string): string[] {
    const ks = this.keysOfId.get(id);
    return ks && ks.size > 1 ? [...ks].sort() : [];
  }

  private unlink(id: string, key: string): void {
    const ks = this.keysOfId.get(id);
    ks?.delete(key);
    if (ks?.size === 0) this.keysOfId.delete(id);
  }

  /** Picks the entry shown for `id` and tells listeners when what they see changed. */
  private resolve(id: string): void {
    const before = this.shown.get(id);
    let best: Entry | undefined;
    for (const k of this.keysOfId.get(id) ?? []) {
      const e = this.byKey.get(k)!;
      if (
        !best ||
        e.createRevision < best.createRevision ||
        (e.createRevision === best.createRevision && e.key < best.key)
      )
        best = e;
    }
    if (!best) {
      if (!before) return;
      this.shown.delete(id);
      this.snapshot = null;
      this.emit({ type: "delete", id });
      return;
    }
    this.shown.set(id, best);
    if (before?.record === best.record) return;
    this.snapshot = null;
    if (before && JSON.stringify(before.record) === JSON.stringify(best.record)) return;
    this.emit({ type: "put", worker: best.record });
  }
}
