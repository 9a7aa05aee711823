/**
 * The tiered store: L2 (shared arena) → L3 (disk) → L4 (remote), with retention classes.
 *
 * - PUT lands in L2. `long` chunks are written through to L3 (and L4) in the background,
 *   under an internal lease so the arena bytes being written cannot be evicted meanwhile.
 *   `short` chunks stay in RAM and are demoted to L3 only when evicted under pressure.
 *   `none` is never stored. In daemon-level ephemeral mode nothing leaves RAM.
 * - GET looks in L2, then L3, then L4; a lower-tier hit is promoted into L2 so the client
 *   can read it from the arena. Chunks are immutable (same key = same bytes), so a PUT of a
 *   key already present is a no-op touch.
 * - TTL: a chunk with a TTL expires from every tier; expired chunks read as misses.
 */
import type { Logger } from "../util/log.ts";
import type { ArenaMapping } from "./arena.ts";
import type { DiskTier } from "./tiers/disk.ts";
import { type L2Entry, RamArenaTier } from "./tiers/ram-arena.ts";
import type { RemoteTier } from "./tiers/remote.ts";
import { chunkId, type PutOptions, type StoredClass, type TierName } from "./types.ts";

export interface StoreOptions {
  arena: ArenaMapping;
  disk?: DiskTier;
  remote?: RemoteTier;
  ephemeral?: boolean;
  log: Logger;
}

export type GetResult = { tier: TierName; entry: L2Entry } | { tier: TierName; data: Buffer } | null;

export interface Reservation {
  ns: string;
  key: string;
  size: number;
  cls: StoredClass;
  expiresAt: number;
  ext: { offset: number; size: number };
}

export class TieredStore {
  readonly l2: RamArenaTier;
  readonly disk?: DiskTier;
  readonly remote?: RemoteTier;
  readonly ephemeral: boolean;
  readonly hits: Record<TierName, number> = { l2: 0, l3: 0, l4: 0 };
  misses = 0;
  remoteErrors = 0;
  private readonly inflight = new Set<Promise<unknown>>();
  private readonly log: Logger;

  constructor(o: StoreOptions) {
    this.l2 = new RamArenaTier(o.arena);
    this.disk = o.ephemeral ? undefined : o.disk;
    this.remote = o.ephemeral ? undefined : o.remote;
    this.ephemeral = o.ephemeral ?? false;
    this.log = o.log;
  }

  private static cls(opts: PutOptions): StoredClass | null {
    const r = opts.retention ?? "long";
    return r === "none" ? null : r;
  }

  private static expiry(opts: PutOptions): number {
    return opts.ttlMs !== undefined && opts.ttlMs > 0 ? Date.now() + opts.ttlMs : 0;
  }

  /** Demotion hook: an evicted chunk with no L3 copy is copied out and written to disk. */
  private readonly onEvict = (e: L2Entry, bytes: Buffer): void => {
    if (!this.disk || e.onDisk || this.disk.has(e.id) || this.disk.isPending(e.id)) return;
    const copy = Buffer.from(bytes);
    this.track(this.disk.write(e.ns, e.key, [copy], e.cls, e.expiresAt));
  };

  private track<T>(p: Promise<T>): void {
    this.inflight.add(p);
    p.catch(() => {}).finally(() => this.inflight.delete(p));
  }

  /** Resolves when background writes (write-through, demotion) have finished. */
  async drain(): Promise<void> {
    while (this.inflight.size > 0) await Promise.allSettled([...this.inflight]);
  }

  async put(ns: string, key: string, data: Buffer, opts: PutOptions = {}): Promise<boolean> {
    const cls = TieredStore.cls(opts);
    if (!cls) return false;
    const id = chunkId(ns, key);
    const have = this.l2.live(id);
    if (have) {
      this.l2.touch(have);
      return true;
    }
    const expiresAt = TieredStore.expiry(opts);
    const ext = this.l2.allocate(data.length, this.onEvict);
    if (!ext) {
      // No room in RAM (everything leased/pinned, or the chunk is larger than the arena).
      if (!this.disk) return false;
      return this.disk.write(ns, key, [data], cls, expiresAt);
    }
    data.copy(this.l2.arena.buf, ext.offset);
    this.commitEntry({ ns, key, size: data.length, cls, expiresAt, ext });
    return true;
  }

  /** ALLOC: reserves arena space the client fills through its own mapping, then COMMITs. */
  reserve(ns: string, key: string, size: number, opts: PutOptions): Reservation | null {
    const cls = TieredStore.cls(opts);
    if (!cls) return null;
    const ext = this.l2.allocate(size, this.onEvict);
    if (!ext) return null;
    return { ns, key, size, cls, expiresAt: TieredStore.expiry(opts), ext };
  }

  commit(r: Reservation): boolean {
    const have = this.l2.live(chunkId(r.ns, r.key));
    if (have) {
      this.abort(r);
      this.l2.touch(have);
      return true;
    }
    this.commitEntry(r);
    return true;
  }

  abort(r: Reservation): void {
    this.l2.alloc.free(r.ext);
  }

  private commitEntry(r: Reservation): void {
    const e: L2Entry = {
      id: chunkId(r.ns, r.key),
      ns: r.ns,
      key: r.key,
      ext: r.ext,
      size: r.size,
      cls: r.cls,
      expiresAt: r.expiresAt,
      leases: 0,
      pinnedUntil: 0,
      deleted: false,
      onDisk: false,
    };
    this.l2.insert(e);
    if (r.cls === "long") this.writeThrough(e);
  }

  private writeThrough(e: L2Entry): void {
    const view = this.l2.view(e);
    const ttl = e.expiresAt === 0 ? 0 : e.expiresAt - Date.now();
    if (this.disk) {
      this.l2.acquire(e);
      const disk = this.disk;
      this.track(
        disk
          .write(e.ns, e.key, [view], e.cls, e.expiresAt)
          .then((ok) => {
            e.onDisk = ok;
          })
          .finally(() => this.l2.release(e)),
      );
    }
    if (this.remote) {
      this.l2.acquire(e);
      this.track(
        this.remote
          .put(e.id, view, ttl)
          .catch((err) => {
            this.remoteErrors++;
            this.log.warn({ err: String(err) }, "kvd L4 put failed");
          })
          .finally(() => this.l2.release(e)),
      );
    }
  }

  /** GET: the entry (leased by the caller via l2.acquire) or, if RAM is full, the bytes. */
  async get(ns: string, key: string): Promise<GetResult> {
    const id = chunkId(ns, key);
    const hit = this.l2.live(id);
    if (hit) {
      this.l2.touch(hit);
      this.hits.l2++;
      return { tier: "l2", entry: hit };
    }
    let data: Buffer | null = null;
    let tier: TierName = "l3";
    let cls: StoredClass = "long";
    let expiresAt = 0;
    if (this.disk?.has(id)) {
      const d = this.disk.index.get(id)!;
      cls = d.cls;
      expiresAt = d.expiresAt;
      data = await this.disk.read(id);
    }
    if (!data && this.remote) {
      try {
        data = await this.remote.get(id);
        tier = "l4";
      } catch (err) {
        this.remoteErrors++;
        this.log.warn({ err: String(err) }, "kvd L4 get failed");
      }
    }
    if (!data) {
      this.misses++;
      return null;
    }
    this.hits[tier]++;
    // Another GET may have promoted it while we were reading.
    const again = this.l2.live(id);
    if (again) return { tier, entry: again };
    const ext = this.l2.allocate(data.length, this.onEvict);
    if (!ext) return { tier, data };
    data.copy(this.l2.arena.buf, ext.offset);
    const e: L2Entry = {
      id,
      ns,
      key,
      ext,
      size: data.length,
      cls,
      expiresAt,
      leases: 0,
      pinnedUntil: 0,
      deleted: false,
      onDisk: tier === "l3",
    };
    this.l2.insert(e);
    return { tier, entry: e };
  }

  /** The highest tier holding a chunk, or null. */
  async where(ns: string, key: string): Promise<TierName | null> {
    const id = chunkId(ns, key);
    if (this.l2.live(id)) return "l2";
    if (this.disk?.has(id)) return "l3";
    if (this.remote) {
      try {
        if (await this.remote.has(id)) return "l4";
      } catch {
        this.remoteErrors++;
      }
    }
    return null;
  }

  /** LOOKUP: how many leading keys of a chain are stored (in any tier). */
  async lookup(ns: string, keys: string[]): Promise<number> {
    let n = 0;
    for (const k of keys) {
      if ((await this.where(ns, k)) === null) break;
      n++;
    }
    return n;
  }

  async delete(ns: string, key: string): Promise<boolean> {
    const id = chunkId(ns, key);
    let any = this.l2.remove(id);
    if (this.disk?.delete(id)) any = true;
    if (this.remote) {
      try {
        if (await this.remote.delete(id)) any = true;
      } catch {
        this.remoteErrors++;
      }
    }
    return any;
  }

  /** PIN: protects an L2 chunk from eviction until `ttlMs` passes (hard pin without one). */
  pin(ns: string, key: string, ttlMs?: number): boolean {
    const e = this.l2.live(chunkId(ns, key));
    if (!e) return false;
    e.pinnedUntil = ttlMs !== undefined && ttlMs > 0 ? Date.now() + ttlMs : Number.POSITIVE_INFINITY;
    return true;
  }

  unpin(ns: string, key: string): boolean {
    const e = this.l2.live(chunkId(ns, key));
    if (!e) return false;
    e.pinnedUntil = 0;
    return true;
  }

  sweep(): void {
    this.l2.sweep();
    this.disk?.sweep();
  }

  stats(): Record<string, unknown> {
    const l2Cap = this.l2.arena.bytes;
    const lookups = this.hits.l2 + this.hits.l3 + this.hits.l4 + this.misses;
    const ratio = (h: number) => (lookups === 0 ? 0 : h / lookups);
    return {
      ephemeral: this.ephemeral,
      lookups,
      misses: this.misses,
      tiers: {
        l2: {
          bytes: this.l2.bytes,
          allocated_bytes: this.l2.alloc.used,
          capacity_bytes: l2Cap,
          chunks: this.l2.entries.size,
          free_extents: this.l2.alloc.freeExtents,
          hits: this.hits.l2,
          hit_rate: ratio(this.hits.l2),
          evictions: { ...this.l2.evictions },
        },
        l3: this.disk
          ? {
              bytes: this.disk.used,
              capacity_bytes: this.disk.capacity,
              chunks: this.disk.index.size,
              hits: this.hits.l3,
              hit_rate: ratio(this.hits.l3),
              evictions: { ...this.disk.evictions },
              corrupt_dropped: this.disk.corrupt,
            }
          : null,
        l4: this.remote
          ? {
              url: this.remote.url,
              hits: this.hits.l4,
              hit_rate: ratio(this.hits.l4),
              errors: this.remoteErrors,
            }
          : null,
      },
    };
  }
}
