/**
 * The fleet's blocks in one table: router block hash (64 bits, two u32 lanes) → the holders
 * (worker DP ranks, as small integer ids) that hold a block with that hash. Matching a prompt is
 * then one walk along its hash chain for all workers together (`walk`), instead of one walk per
 * worker; the per-rank state only keeps the engine hash → entry map that removals need.
 *
 * Layout (typed arrays only, so 100M blocks cost no GC work):
 * - entries with stable ids (1-based; a rank's engine map stores the id): `lo`, `hi` (the key),
 *   `next` (the bucket chain, or the free list) and `hold` (the holders);
 * - `buckets`: the head entry of each chain (separate chaining keeps ids stable, which open
 *   addressing with backward-shift deletion would not);
 * - `hold[id]`: 0 for a free entry; `h + 1` (top bit clear) for one holder `h`, the common case,
 *   stored inline; `SHARED | offset` for a holder list in `slab`: `[length, capacity, h...]`,
 *   capacities 2, 4, 8, … with a free list per capacity.
 * A rank that holds two blocks with one router hash appears twice in the list (a multiset), so
 * removing one leaves the other, as the per-rank multisets before did.
 */

const SHARED = 0x80000000;
const OFFSET = 0x7fffffff;
const MIN_BUCKETS = 16;
/** Chains may average this many entries before the bucket array doubles (memory vs. probes). */
const BUCKET_LOAD = 1;
const FIRST_CLASS = 1; // capacity 2: most shared blocks have few holders

export class BlockTable {
  private lo = new Uint32Array(16);
  private hi = new Uint32Array(16);
  private next = new Uint32Array(16);
  private hold = new Uint32Array(16);
  private buckets = new Uint32Array(MIN_BUCKETS);
  private mask = MIN_BUCKETS - 1;
  /** Entry ids handed out so far (id 0 is never used). */
  private top = 1;
  private freeHead = 0;
  /** Distinct router hashes held. */
  size = 0;
  private slab = new Uint32Array(64);
  private slabTop = 2;
  /** Free slab blocks per capacity class (offset, 0 = none; linked through slab[o]). */
  private readonly slabFree: number[] = [];

  /** Entry id of the hash (`lo`, `hi`), or 0. */
  find(lo: number, hi: number): number {
    const l = lo >>> 0;
    const h = hi >>> 0;
    let id = this.buckets[l & this.mask];
    const klo = this.lo;
    const khi = this.hi;
    const next = this.next;
    while (id !== 0) {
      if (klo[id] === l && khi[id] === h) return id;
      id = next[id];
    }
    return 0;
  }

  /** The hash's low lane of entry `id`. */
  loOf(id: number): number {
    return this.lo[id];
  }

  /** The hash's high lane of entry `id`. */
  hiOf(id: number): number {
    return this.hi[id];
  }

  /** Adds `holder` to the entry of hash (`lo`, `hi`), creating it; returns the entry id. */
  acquire(lo: number, hi: number, holder: number): number {
    let id = this.find(lo, hi);
    if (id === 0) id = this.create(lo >>> 0, hi >>> 0);
    this.addHolder(id, holder);
    return id;
  }

  /** Removes one occurrence of `holder` from entry `id`; frees the entry when none is left. */
  release(id: number, holder: number): void {
    const v = this.hold[id];
    if ((v & SHARED) === 0) {
      if (v === holder + 1) this.free(id);
      return;
    }
    const o = v & OFFSET;
    const s = this.slab;
    const len = s[o];
    for (let j = 0; j < len; j++) {
      if (s[o + 2 + j] !== holder) continue;
      s[o + 2 + j] = s[o + 1 + len];
      s[o] = len - 1;
      if (len - 1 === 1) {
        // Back to one holder: inline again, so unshared blocks never keep a slab block.
        this.hold[id] = s[o + 2] + 1;
        this.slabRelease(o);
      }
      return;
    }
  }

  /**
   * The one walk: `marks[h] === base + k` says holder `h` is a candidate that holds blocks
   * 0..k-1 of `chain`. At each depth k, the holders of block k whose mark is `base + k` move on
   * to `base + k + 1`; the walk stops at the first block nobody left holds (or that no entry
   * has). Afterwards a candidate's overlap is `marks[h] - base`. Returns the depth reached.
   */
  walk(chain: Uint32Array, blocks: number, marks: Uint32Array, base: number): number {
    const hold = this.hold;
    const s = this.slab;
    for (let k = 0; k < blocks; k++) {
      const id = this.find(chain[2 * k], chain[2 * k + 1]);
      if (id === 0) return k;
      const cur = (base + k) >>> 0;
      const nxt = (cur + 1) >>> 0;
      let moved = 0;
      const v = hold[id];
      if ((v & SHARED) === 0) {
        const h = v - 1;
        if (marks[h] === cur) {
          marks[h] = nxt;
          moved = 1;
        }
      } else {
        const o = v & OFFSET;
        const end = o + 2 + s[o];
        for (let j = o + 2; j < end; j++) {
          const h = s[j];
          if (marks[h] === cur) {
            marks[h] = nxt;
            moved++;
          }
        }
      }
      if (moved === 0) return k;
    }
    return blocks;
  }

  /** Bytes held by the typed arrays. */
  bytes(): number {
    return (
      this.lo.byteLength +
      this.hi.byteLength +
      this.next.byteLength +
      this.hold.byteLength +
      this.buckets.byteLength +
      this.slab.byteLength
    );
  }

  private create(lo: number, hi: number): number {
    let id = this.freeHead;
    if (id !== 0) this.freeHead = this.next[id];
    else {
      if (this.top >= this.lo.length) this.growEntries();
      id = this.top++;
    }
    this.lo[id] = lo;
    this.hi[id] = hi;
    this.hold[id] = 0;
    this.size++;
    if (this.size > this.buckets.length * BUCKET_LOAD) this.rehash(this.buckets.length * 2);
    const b = lo & this.mask;
    this.next[id] = this.buckets[b];
    this.buckets[b] = id;
    return id;
  }

  private free(id: number): void {
    const b = this.lo[id] & this.mask;
    let cur = this.buckets[b];
    if (cur === id) this.buckets[b] = this.next[id];
    else {
      while (this.next[cur] !== id) cur = this.next[cur];
      this.next[cur] = this.next[id];
    }
    this.hold[id] = 0;
    this.next[id] = this.freeHead;
    this.freeHead = id;
    this.size--;
  }

  private addHolder(id: number, holder: number): void {
    const v = this.hold[id];
    if (v === 0) {
      this.hold[id] = holder + 1;
      return;
    }
    if ((v & SHARED) === 0) {
      const o = this.slabAlloc(FIRST_CLASS);
      const s = this.slab;
      s[o] = 2;
      s[o + 2] = v - 1;
      s[o + 3] = holder;
      this.hold[id] = SHARED | o;
      return;
    }
    let o = v & OFFSET;
    const len = this.slab[o];
    if (len === this.slab[o + 1]) {
      const bigger = this.slabAlloc(31 - Math.clz32(len) + 1);
      this.slab.copyWithin(bigger + 2, o + 2, o + 2 + len);
      this.slabRelease(o);
      o = bigger;
      this.hold[id] = SHARED | o;
    }
    this.slab[o + 2 + len] = holder;
    this.slab[o] = len + 1;
  }

  /** A slab block for 2^cls holders (header included), length left for the caller to set. */
  private slabAlloc(cls: number): number {
    const cap = 1 << cls;
    let o = this.slabFree[cls] ?? 0;
    if (o !== 0) this.slabFree[cls] = this.slab[o];
    else {
      o = this.slabTop;
      const need = o + 2 + cap;
      if (need > this.slab.length) {
        let n = Math.ceil(this.slab.length * 1.5);
        while (n < need) n = Math.ceil(n * 1.5);
        const grown = new Uint32Array(n);
        grown.set(this.slab);
        this.slab = grown;
      }
      this.slabTop = need;
    }
    this.slab[o + 1] = cap;
    return o;
  }

  private slabRelease(o: number): void {
    const cls = 31 - Math.clz32(this.slab[o + 1]);
    this.slab[o] = this.slabFree[cls] ?? 0;
    this.slabFree[cls] = o;
  }

  private growEntries(): void {
    // ×1.5, not ×2: at 100M entries a doubling would leave up to 800 MB unused.
    const n = Math.ceil(this.lo.length * 1.5);
    const grow = (a: Uint32Array) => {
      const g = new Uint32Array(n);
      g.set(a);
      return g;
    };
    this.lo = grow(this.lo);
    this.hi = grow(this.hi);
    this.next = grow(this.next);
    this.hold = grow(this.hold);
  }

  private rehash(n: number): void {
    this.buckets = new Uint32Array(n);
    this.mask = n - 1;
    const { lo, next, hold, buckets } = this;
    for (let id = 1; id < this.top; id++) {
      if (hold[id] === 0) continue;
      const b = lo[id] & this.mask;
      next[id] = buckets[b];
      buckets[b] = id;
    }
  }
}
