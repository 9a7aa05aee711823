/**
 * The fleet's blocks in one table: router block hash (64 bits, two u32 lanes) → the holders
 * (worker DP ranks, as small integer ids) that hold a block with that hash. Matching a prompt is
 * then one walk along its hash chain for all workers together (`walk`), instead of one walk per
 * worker; the per-rank state only keeps the engine hash → entry map that removals need.
 *
 * Layout (typed arrays only, so 100M blocks cost no GC work):
 * - entries with stable ids (1-based; a rank's engine map stores the id), four u32 each,
 *   interleaved so one cache line serves a probe: `lo`, `hi` (the key), `next` (the bucket
 *   chain, or the free list) and `hold` (the holders). They live in pages of PAGE entries
 *   added as needed: growing never copies, and never leaves more than one page unused (a
 *   single array grown ×1.5 left up to a third of 56M entries, ~350 MB, empty at 1,000 × 100k);
 * - `buckets`: the head entry of each chain (separate chaining keeps ids stable, which open
 *   addressing with backward-shift deletion would not);
 * - hold: 0 for a free entry; `h + 1` (top bit clear) for one holder `h`, the common case,
 *   stored inline; `SHARED | offset` for several: an interned, shared holder set
 *   (./holder-sets.ts), so the blocks one replica group holds all point at one set.
 * A rank that holds two blocks with one router hash appears twice in the set (a multiset), so
 * removing one leaves the other, as the per-rank multisets before did.
 */
import { HolderSets, SET_HEADER, SET_LEN } from "./holder-sets.ts";

const SHARED = 0x80000000;
const OFFSET = 0x7fffffff;
const MIN_BUCKETS = 16;
/**
 * Chains may average this many entries before the bucket array doubles (memory vs. probes):
 * 2, so 56M distinct blocks take 2^25 buckets (128 MiB) rather than 2^26. The walk reads a
 * bucket only where its next-entry guess misses (see walk), so longer chains cost it little;
 * an insert of a new block follows its chain to the end (1.7 entries on average, at most 2
 * before doubling, instead of 0.8).
 */
const BUCKET_LOAD = 2;
/** Entries per page (2^PAGE_BITS); an entry is 4 u32 at `(id & PAGE_MASK) << 2` of its page. */
const PAGE_BITS = 13;
const PAGE_MASK = (1 << PAGE_BITS) - 1;
const LO = 0;
const HI = 1;
const NEXT = 2;
const HOLD = 3;
/** Blocks whose lookups the walk starts together (see walk). */
const WALK_BATCH = 16;

export class BlockTable {
  /** Entry pages: entry `id` is `pages[id >>> PAGE_BITS]` at `(id & PAGE_MASK) << 2`. */
  private readonly pages: Uint32Array[] = [];
  private buckets = new Uint32Array(MIN_BUCKETS);
  private mask = MIN_BUCKETS - 1;
  /** Entry ids handed out so far (id 0 is never used). */
  private top = 1;
  /** The highest entry id this table may hand out (the holder of the ids may store fewer bits). */
  private readonly maxId: number;
  private freeHead = 0;
  /** Distinct router hashes held. */
  size = 0;
  /** Holder sets of the blocks held by several ranks. */
  private readonly sets = new HolderSets();
  /** The walk's batch of bucket heads. */
  private readonly heads = new Uint32Array(WALK_BATCH);
  /** Where the walk leaves the words it touched ahead (see done). */
  sink = 0;
  /** The entry of the last block the last walk found (where a continued walk guesses next). */
  private lastId = 0;

  /** `maxId`: the highest entry id to hand out (default: any uint32). */
  constructor(maxId = 0xffffffff) {
    this.maxId = maxId;
  }

  /** Entry id of the hash (`lo`, `hi`), or 0. */
  find(lo: number, hi: number): number {
    const l = lo >>> 0;
    const h = hi >>> 0;
    let id = this.buckets[l & this.mask];
    const pages = this.pages;
    while (id !== 0) {
      const p = pages[id >>> PAGE_BITS];
      const o = (id & PAGE_MASK) << 2;
      if (p[o] === l && p[o + HI] === h) return id;
      id = p[o + NEXT];
    }
    return 0;
  }

  private get(id: number, field: number): number {
    return this.pages[id >>> PAGE_BITS][((id & PAGE_MASK) << 2) + field];
  }

  private put(id: number, field: number, v: number): void {
    this.pages[id >>> PAGE_BITS][((id & PAGE_MASK) << 2) + field] = v;
  }

  /** The hash's low lane of entry `id`. */
  loOf(id: number): number {
    return this.get(id, LO);
  }

  /** The hash's high lane of entry `id`. */
  hiOf(id: number): number {
    return this.get(id, HI);
  }

  /**
   * Adds `holder` to the entry of hash (`lo`, `hi`), creating it; returns the entry id, or 0
   * (nothing changed) when the hash is new and every id up to `maxId` is in use.
   */
  acquire(lo: number, hi: number, holder: number): number {
    let id = this.find(lo, hi);
    if (id === 0) {
      if (this.freeHead === 0 && this.top > this.maxId) return 0;
      id = this.create(lo >>> 0, hi >>> 0);
    }
    this.addHolder(id, holder);
    return id;
  }

  /** Removes one occurrence of `holder` from entry `id`; frees the entry when none is left. */
  release(id: number, holder: number): void {
    const v = this.get(id, HOLD);
    if ((v & SHARED) === 0) {
      if (v === holder + 1) this.free(id);
      return;
    }
    const o = v & OFFSET;
    const sets = this.sets;
    if (!sets.has(o, holder)) return;
    if (sets.len(o) === 2) {
      // Back to one holder: inline again, so unshared blocks never keep a set.
      const other = sets.holder(o, 0) === holder ? sets.holder(o, 1) : sets.holder(o, 0);
      this.put(id, HOLD, other + 1);
    } else this.put(id, HOLD, SHARED | sets.withRemoved(o, holder));
    sets.release(o);
  }

  /** Live holder sets (blocks held by the same ranks share one). */
  holderSets(): number {
    return this.sets.count;
  }

  /**
   * The one walk: `marks[h] === base + k` says holder `h` is a candidate that holds blocks
   * 0..k-1 of `chain`. At each depth k, the holders of block k whose mark is `base + k` move on
   * to `base + k + 1`; the walk stops at the first block nobody left holds (or that no entry
   * has). Afterwards a candidate's overlap is `marks[h] - base`. Walks blocks `from` up to
   * `blocks` (a caller hashing the prompt piece by piece continues where it left off) and
   * returns the depth reached: below `blocks` when it stopped.
   *
   * Each block is first looked for next to the previous block's entry (`lastId` ± 1): the
   * blocks of one BlockStored event get consecutive entries (fresh ones in order, recycled ones
   * off the free list in reverse), so along a stored chain the next entry is usually on the
   * same cache line and page, and the bucket array (a random access into ~256 MB at 1,000 ×
   * 100k, a cache and TLB miss) is not read. A live entry with the block's key is the block's
   * entry (keys are unique), so the guess never changes the result. Blocks whose guess misses
   * are looked up through their buckets, WALK_BATCH at a time.
   */
  walk(chain: Uint32Array, blocks: number, marks: Uint32Array, base: number, from = 0): number {
    const s = this.sets.slab;
    const pages = this.pages;
    const buckets = this.buckets;
    const mask = this.mask;
    const heads = this.heads;
    const top = this.top;
    let touch = 0;
    let prev = from === 0 ? 0 : this.lastId;
    let batchEnd = from;
    let headsFrom = from;
    for (let k = from; k < blocks; k++) {
      const l = chain[2 * k];
      const h = chain[2 * k + 1];
      let id = 0;
      let p: Uint32Array = s;
      let o = 0;
      if (prev !== 0) {
        // The guesses: the entry after the previous block's, then the one before.
        let g = prev + 1;
        if (g < top) {
          p = pages[g >>> PAGE_BITS];
          o = (g & PAGE_MASK) << 2;
          if (p[o] === l && p[o + HI] === h && p[o + HOLD] !== 0) id = g;
        }
        if (id === 0 && prev > 1) {
          g = prev - 1;
          p = pages[g >>> PAGE_BITS];
          o = (g & PAGE_MASK) << 2;
          if (p[o] === l && p[o + HI] === h && p[o + HOLD] !== 0) id = g;
        }
      }
      if (id === 0) {
        if (k >= batchEnd) {
          // The blocks' bucket lookups do not depend on each other, only the stop does:
          // loading a batch of bucket heads, then touching their first entries, lets those
          // cache misses overlap instead of paying them one after the other.
          batchEnd = Math.min(blocks, k + WALK_BATCH);
          for (let j = k; j < batchEnd; j++) heads[j - k] = buckets[chain[2 * j] & mask];
          for (let j = k; j < batchEnd; j++) {
            const e = heads[j - k];
            if (e !== 0) touch ^= pages[e >>> PAGE_BITS][(e & PAGE_MASK) << 2];
          }
          headsFrom = k;
        }
        // find(), inlined: the entry's page and offset are needed for its holders as well.
        id = heads[k - headsFrom];
        while (id !== 0) {
          p = pages[id >>> PAGE_BITS];
          o = (id & PAGE_MASK) << 2;
          if (p[o] === l && p[o + HI] === h) break;
          id = p[o + NEXT];
        }
        if (id === 0) return this.done(k, touch, prev);
      }
      prev = id;
      const cur = (base + k) >>> 0;
      const nxt = (cur + 1) >>> 0;
      const v = p[o + HOLD];
      if ((v & SHARED) === 0) {
        const hd = v - 1;
        if (marks[hd] !== cur) return this.done(k, touch, prev);
        marks[hd] = nxt;
        continue;
      }
      let moved = 0;
      const so = v & OFFSET;
      const end = so + SET_HEADER + s[so + SET_LEN];
      for (let j = so + SET_HEADER; j < end; j++) {
        const hd = s[j];
        if (marks[hd] === cur) {
          marks[hd] = nxt;
          moved++;
        }
      }
      if (moved === 0) return this.done(k, touch, prev);
    }
    return this.done(blocks, touch, prev);
  }

  /** Returns `depth`; keeps the touched words observable so the compiler keeps the loads. */
  private done(depth: number, touch: number, last: number): number {
    this.sink = touch;
    this.lastId = last;
    return depth;
  }

  /** Bytes held by the typed arrays. */
  bytes(): number {
    let n = this.buckets.byteLength + this.sets.bytes();
    for (const p of this.pages) n += p.byteLength;
    return n;
  }

  private create(lo: number, hi: number): number {
    let id = this.freeHead;
    if (id !== 0) this.freeHead = this.get(id, NEXT);
    else {
      if (this.top >>> PAGE_BITS >= this.pages.length) this.pages.push(new Uint32Array(4 << PAGE_BITS));
      id = this.top++;
    }
    const p = this.pages[id >>> PAGE_BITS];
    const o = (id & PAGE_MASK) << 2;
    p[o] = lo;
    p[o + HI] = hi;
    p[o + HOLD] = 0;
    this.size++;
    if (this.size > this.buckets.length * BUCKET_LOAD) this.rehash(this.buckets.length * 2);
    const b = lo & this.mask;
    p[o + NEXT] = this.buckets[b];
    this.buckets[b] = id;
    return id;
  }

  private free(id: number): void {
    const b = this.get(id, LO) & this.mask;
    let cur = this.buckets[b];
    if (cur === id) this.buckets[b] = this.get(id, NEXT);
    else {
      while (this.get(cur, NEXT) !== id) cur = this.get(cur, NEXT);
      this.put(cur, NEXT, this.get(id, NEXT));
    }
    this.put(id, HOLD, 0);
    this.put(id, NEXT, this.freeHead);
    this.freeHead = id;
    this.size--;
  }

  private addHolder(id: number, holder: number): void {
    const v = this.get(id, HOLD);
    if (v === 0) this.put(id, HOLD, holder + 1);
    else if ((v & SHARED) === 0) this.put(id, HOLD, SHARED | this.sets.pair(v - 1, holder));
    else {
      const o = v & OFFSET;
      this.put(id, HOLD, SHARED | this.sets.withAdded(o, holder));
      this.sets.release(o);
    }
  }

  private rehash(n: number): void {
    this.buckets = new Uint32Array(n);
    this.mask = n - 1;
    const { pages, buckets } = this;
    for (let id = 1; id < this.top; id++) {
      const p = pages[id >>> PAGE_BITS];
      const o = (id & PAGE_MASK) << 2;
      if (p[o + HOLD] === 0) continue;
      const b = p[o] & this.mask;
      p[o + NEXT] = buckets[b];
      buckets[b] = id;
    }
  }
}
