/**
 * Interned holder sets for the fleet's BlockTable (./block-table.ts): a block held by several
 * ranks points at one shared, reference-counted set instead of a list of its own. Blocks that
 * the same ranks hold (the chains a replica group of workers serves, a system prompt every
 * worker holds) then share one set: 6.25M blocks held by groups of 8 cost 125 × 8 sets instead
 * of 6.25M lists of 8 (0.23-0.35 GiB at 1,000 workers × 100k blocks in bench/kv-index).
 *
 * A set is a sorted multiset of holder ids (a rank holding two blocks with one router hash is
 * in it twice, so releasing one leaves the other). Sets are copy-on-write: adding or removing
 * a holder looks up (or makes) the set with that content and moves the reference, so a set
 * never changes while blocks point at it. The lookup key is the sum of the holders' mixed ids
 * (order-free, updated by one add or subtract), confirmed by comparing contents.
 *
 * Layout: records in one Uint32Array `slab` at offsets ≥ 1: `[refs, hash, len, cls, h0, h1, …]`
 * with room for 2^cls holders, free lists per cls; `index`: open addressing over record
 * offsets keyed by hash (linear probing, backward-shift deletion).
 */
import { fmix32 } from "./hash.ts";

const REFS = 0;
const HASH = 1;
const LEN = 2;
const CLS = 3;
/** Words before the holders of a record. */
export const SET_HEADER = 4;
/** Offset of a record's length word. */
export const SET_LEN = LEN;

function mix(h: number): number {
  return fmix32((h + 0x9e3779b9) | 0);
}

export class HolderSets {
  /** The records (read directly by BlockTable.walk). */
  slab = new Uint32Array(256);
  private top = 1;
  private readonly free: number[] = [];
  private index = new Uint32Array(64);
  private mask = 63;
  /** Live sets. */
  count = 0;

  /** Holders in set `o`. */
  len(o: number): number {
    return this.slab[o + LEN];
  }

  /** Holder `i` of set `o`. */
  holder(o: number, i: number): number {
    return this.slab[o + SET_HEADER + i];
  }

  /** Whether `h` is in set `o`. */
  has(o: number, h: number): boolean {
    const s = this.slab;
    const end = o + SET_HEADER + s[o + LEN];
    for (let j = o + SET_HEADER; j < end; j++) if (s[j] === h) return true;
    return false;
  }

  /** The set `{a, b}`, referenced once more. */
  pair(a: number, b: number): number {
    const hash = (mix(a) + mix(b)) >>> 0;
    const lo = Math.min(a, b);
    const hi = Math.max(a, b);
    const s = this.slab;
    for (let i = hash & this.mask; ; i = (i + 1) & this.mask) {
      const t = this.index[i];
      if (t === 0) break;
      if (
        s[t + HASH] === hash &&
        s[t + LEN] === 2 &&
        s[t + SET_HEADER] === lo &&
        s[t + SET_HEADER + 1] === hi
      ) {
        s[t + REFS]++;
        return t;
      }
    }
    const t = this.make(hash, 2);
    this.slab[t + SET_HEADER] = lo;
    this.slab[t + SET_HEADER + 1] = hi;
    return t;
  }

  /** The set `o ∪ {h}` (a multiset: h may already be in it), referenced once more; `o` is left as it is. */
  withAdded(o: number, h: number): number {
    const s = this.slab;
    const n = s[o + LEN];
    const hash = (s[o + HASH] + mix(h)) >>> 0;
    for (let i = hash & this.mask; ; i = (i + 1) & this.mask) {
      const t = this.index[i];
      if (t === 0) break;
      if (s[t + HASH] === hash && s[t + LEN] === n + 1 && this.samePlus(t, o, n, h)) {
        s[t + REFS]++;
        return t;
      }
    }
    const t = this.make(hash, n + 1);
    const d = this.slab;
    let j = o + SET_HEADER;
    const end = j + n;
    let k = t + SET_HEADER;
    while (j < end && d[j] <= h) d[k++] = d[j++];
    d[k++] = h;
    while (j < end) d[k++] = d[j++];
    return t;
  }

  /** The set `o` less one `h` (which it holds; at least 3 holders), referenced once more. */
  withRemoved(o: number, h: number): number {
    const s = this.slab;
    const n = s[o + LEN];
    const hash = (s[o + HASH] - mix(h)) >>> 0;
    for (let i = hash & this.mask; ; i = (i + 1) & this.mask) {
      const t = this.index[i];
      if (t === 0) break;
      if (s[t + HASH] === hash && s[t + LEN] === n - 1 && this.sameMinus(t, o, n, h)) {
        s[t + REFS]++;
        return t;
      }
    }
    const t = this.make(hash, n - 1);
    const d = this.slab;
    let k = t + SET_HEADER;
    let skipped = false;
    for (let j = o + SET_HEADER; j < o + SET_HEADER + n; j++) {
      if (!skipped && d[j] === h) skipped = true;
      else d[k++] = d[j];
    }
    return t;
  }

  /** Drops one reference to set `o`; frees it at none. */
  release(o: number): void {
    const s = this.slab;
    if (--s[o + REFS] !== 0) return;
    this.unindex(o);
    const cls = s[o + CLS];
    s[o + REFS] = this.free[cls] ?? 0;
    this.free[cls] = o;
    this.count--;
  }

  bytes(): number {
    return this.slab.byteLength + this.index.byteLength;
  }

  /** Whether set `t` is set `o` (n holders) with `h` added. */
  private samePlus(t: number, o: number, n: number, h: number): boolean {
    const s = this.slab;
    let j = o + SET_HEADER;
    const end = j + n;
    let k = t + SET_HEADER;
    while (j < end && s[j] <= h) if (s[k++] !== s[j++]) return false;
    if (s[k++] !== h) return false;
    while (j < end) if (s[k++] !== s[j++]) return false;
    return true;
  }

  /** Whether set `t` is set `o` (n holders) less one `h`. */
  private sameMinus(t: number, o: number, n: number, h: number): boolean {
    const s = this.slab;
    let k = t + SET_HEADER;
    let skipped = false;
    for (let j = o + SET_HEADER; j < o + SET_HEADER + n; j++) {
      if (!skipped && s[j] === h) skipped = true;
      else if (s[k++] !== s[j]) return false;
    }
    return skipped;
  }

  /** A new record for `len` holders with one reference, indexed under `hash`; holders left to the caller. */
  private make(hash: number, len: number): number {
    const cls = 32 - Math.clz32(len - 1);
    let o = this.free[cls] ?? 0;
    if (o !== 0) this.free[cls] = this.slab[o + REFS];
    else {
      o = this.top;
      const need = o + SET_HEADER + (1 << cls);
      if (need > this.slab.length) {
        let n = this.slab.length * 2;
        while (n < need) n *= 2;
        const grown = new Uint32Array(n);
        grown.set(this.slab);
        this.slab = grown;
      }
      this.top = need;
    }
    const s = this.slab;
    s[o + REFS] = 1;
    s[o + HASH] = hash;
    s[o + LEN] = len;
    s[o + CLS] = cls;
    this.count++;
    if (this.count * 2 > this.index.length) this.reindex(this.index.length * 2);
    let i = hash & this.mask;
    while (this.index[i] !== 0) i = (i + 1) & this.mask;
    this.index[i] = o;
    return o;
  }

  private unindex(o: number): void {
    const idx = this.index;
    const mask = this.mask;
    const s = this.slab;
    let i = s[o + HASH] & mask;
    while (idx[i] !== o) i = (i + 1) & mask;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const t = idx[j];
      if (t === 0) break;
      const home = s[t + HASH] & mask;
      if (((j - home) & mask) >= ((j - i) & mask)) {
        idx[i] = t;
        i = j;
      }
    }
    idx[i] = 0;
  }

  private reindex(n: number): void {
    const old = this.index;
    this.index = new Uint32Array(n);
    this.mask = n - 1;
    const s = this.slab;
    for (let k = 0; k < old.length; k++) {
      const o = old[k];
      if (o === 0) continue;
      let i = s[o + HASH] & this.mask;
      while (this.index[i] !== 0) i = (i + 1) & this.mask;
      this.index[i] = o;
    }
  }
}
