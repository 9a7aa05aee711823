/**
 * One worker rank's map from the engine's block hash to the block's entry id in the fleet-wide
 * BlockTable (./block-table.ts): what `BlockRemoved` (engine hashes only) and a `BlockStored`
 * whose parent is an engine hash need. At 1,000 ranks × 100k blocks these maps are half the
 * index, so a slot is 10 bytes:
 * - the key as 52 bits: an engine hash is a number (./event-model.ts EngineBlockHash), and an
 *   integer in [0, 2^52) is kept as it is, exactly: vLLM's default sha256 digests arrive as
 *   bytes, which the decoders fold into 52 bits before they get here. Any other number (an
 *   int64/uint64 hash such as SGLang's, already rounded to a double by the decoder; a float) is
 *   mixed down to a 52-bit fingerprint: two live blocks of one rank then share a key with
 *   probability about n²/2^53 (1.1e-6 for a 100k-block rank), the odds the folded sha256
 *   digests already had. Router hashes, which decide a hit, stay 64-bit;
 * - the value (an entry id) as 28 bits, below MAX_VALUE (268M distinct blocks in the fleet).
 * Layout: `pair` holds `lo` (key bits 0–31) and `hv` (key bits 32–51, value bits 0–11) side by
 * side; `top` holds value bits 12–27 plus one, 0 for an empty slot.
 *
 * Robin Hood linear probing up to 92 % load, with a capacity of any size (a key's home slot is
 * its 32-bit mix scaled to the capacity, not masked), so a rank sized for its pool ends near
 * 92 % instead of at whatever a power of two leaves (100k blocks in 131,072 slots: 76 %). A key
 * never sits farther from its home than a key it passed, so a lookup of an absent key stops at
 * the first slot whose key is nearer its own home than the probe is. Deletion shifts the run
 * back (no tombstones build up under a KV cache's store/evict churn).
 */

/** The largest value a slot holds: 28 bits, less 4,096 (`(v >>> 12) + 1` must fit 16 bits). */
export const MAX_VALUE = 0xfffefff;

const MIN_CAP = 16;
/** Highest load: Robin Hood probing keeps lookups short this full. */
const MAX_LOAD = 0.92;
/** Growth factor past the expected size (not a power of two: the capacity is any size). */
const GROWTH = 1.5;
const HI_MASK = 0xfffff;
const TWO_32 = 4294967296;
const TWO_52 = 4503599627370496;

function capacityFor(n: number): number {
  return Math.max(MIN_CAP, Math.ceil(n / MAX_LOAD) + 1);
}

const f64 = new Float64Array(1);
const f64w = new Uint32Array(f64.buffer);
/** The key's two lanes, set by `lanes` (no allocation per call). */
let kLo = 0;
let kHi = 0;

/** Sets kLo/kHi to `key` as 52 bits: exact for an integer in [0, 2^52), a fingerprint otherwise. */
function lanes(key: number): void {
  if (key >= 0 && key < TWO_52 && Math.floor(key) === key) {
    kLo = key >>> 0;
    kHi = (key / TWO_32) >>> 0;
    return;
  }
  f64[0] = key;
  const a = f64w[0];
  const b = f64w[1];
  let h = Math.imul(a ^ (b >>> 15), 0x85ebca6b) ^ Math.imul(b, 0xc2b2ae35);
  h ^= h >>> 13;
  kLo = Math.imul(h, 0x27d4eb2f) >>> 0;
  let g = Math.imul(b ^ (a >>> 17), 0x9e3779b1) ^ Math.imul(a, 0x165667b1);
  g ^= g >>> 15;
  kHi = Math.imul(g, 0x61c88647) & HI_MASK;
}

/** The 32-bit mix of a 52-bit key (lo, hi). */
function mix(lo: number, hi: number): number {
  let h = lo ^ Math.imul(hi, 0x9e3779b1);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

export class EngineBlockMap {
  /** Slot i: `pair[2i]` = key bits 0–31, `pair[2i+1]` = key bits 32–51 | value bits 0–11 << 20. */
  private pair: Uint32Array;
  /** Slot i: value bits 12–27, plus one; 0 = empty. */
  private top: Uint16Array;
  private cap: number;
  size = 0;

  constructor(expected = 0) {
    this.cap = capacityFor(expected);
    this.pair = new Uint32Array(this.cap * 2);
    this.top = new Uint16Array(this.cap);
  }

  /** The home slot of the key (lo, hi). */
  private home(lo: number, hi: number): number {
    // mix < 2^32, so mix × cap < cap × 2^32: exact below 2^53, and above it the rounding error
    // (under cap × 2^-21) cannot reach cap × 2^32, which is at least cap away.
    return Math.floor((mix(lo, hi) * this.cap) / TWO_32);
  }

  /** Slot of `key`, or -1. */
  find(key: number): number {
    lanes(key);
    const lo = kLo;
    const hi = kHi;
    const pair = this.pair;
    const top = this.top;
    const cap = this.cap;
    let i = this.home(lo, hi);
    for (let d = 0; ; d++) {
      if (top[i] === 0) return -1;
      const sLo = pair[2 * i];
      const sHi = pair[2 * i + 1] & HI_MASK;
      if (sLo === lo && sHi === hi) return i;
      // Robin Hood: the key would have displaced a key nearer its home than d.
      if (d > 0) {
        const sd = i - this.home(sLo, sHi);
        if ((sd < 0 ? sd + cap : sd) < d) return -1;
      }
      i = i + 1 === cap ? 0 : i + 1;
    }
  }

  valueAt(slot: number): number {
    return (this.pair[2 * slot + 1] >>> 20) | ((this.top[slot] - 1) << 12);
  }

  /** Overwrites the value at `slot` (from `find`); `value` ≤ MAX_VALUE. */
  setAt(slot: number, value: number): void {
    checkValue(value);
    this.pair[2 * slot + 1] = (this.pair[2 * slot + 1] & HI_MASK) | ((value & 0xfff) << 20);
    this.top[slot] = (value >>> 12) + 1;
  }

  /** Inserts or overwrites; returns true when the key was new. */
  set(key: number, value: number): boolean {
    const at = this.find(key);
    if (at >= 0) {
      this.setAt(at, value);
      return false;
    }
    this.insertNew(key, value);
    return true;
  }

  /** Inserts a key known to be absent (after a failed `find`); `value` ≤ MAX_VALUE. */
  insertNew(key: number, value: number): void {
    checkValue(value);
    if (this.size + 1 > this.cap * MAX_LOAD) this.resize(Math.ceil(this.cap * GROWTH));
    lanes(key);
    this.place(kLo, kHi, value);
    this.size++;
  }

  /** Removes the key at `slot` (from `find`): the keys after it that are not at home move back one. */
  deleteAt(slot: number): void {
    const pair = this.pair;
    const top = this.top;
    const cap = this.cap;
    let i = slot;
    for (;;) {
      const j = i + 1 === cap ? 0 : i + 1;
      const t = top[j];
      if (t === 0) break;
      const sLo = pair[2 * j];
      const sHv = pair[2 * j + 1];
      if (this.home(sLo, sHv & HI_MASK) === j) break;
      pair[2 * i] = sLo;
      pair[2 * i + 1] = sHv;
      top[i] = t;
      i = j;
    }
    top[i] = 0;
    this.size--;
  }

  /** Calls `fn` with every value (e.g. to release what a rank held before clearing it). */
  forEachValue(fn: (value: number) => void): void {
    const top = this.top;
    for (let i = 0; i < top.length; i++) if (top[i] !== 0) fn(this.valueAt(i));
  }

  clear(): void {
    this.cap = MIN_CAP;
    this.pair = new Uint32Array(MIN_CAP * 2);
    this.top = new Uint16Array(MIN_CAP);
    this.size = 0;
  }

  bytes(): number {
    return this.pair.byteLength + this.top.byteLength;
  }

  /** Places (lo, hi) → value in the first slot Robin Hood gives it. */
  private place(lo: number, hi: number, value: number): void {
    const pair = this.pair;
    const top = this.top;
    const cap = this.cap;
    let kl = lo;
    let hv = (hi | ((value & 0xfff) << 20)) >>> 0;
    let t = (value >>> 12) + 1;
    let i = this.home(lo, hi);
    for (let d = 0; ; d++) {
      const st = top[i];
      if (st === 0) {
        pair[2 * i] = kl;
        pair[2 * i + 1] = hv;
        top[i] = t;
        return;
      }
      const sLo = pair[2 * i];
      const sHv = pair[2 * i + 1];
      let sd = i - this.home(sLo, sHv & HI_MASK);
      if (sd < 0) sd += cap;
      if (sd < d) {
        // Take the slot from a key nearer its home, and carry that one on.
        pair[2 * i] = kl;
        pair[2 * i + 1] = hv;
        top[i] = t;
        kl = sLo;
        hv = sHv;
        t = st;
        d = sd;
      }
      i = i + 1 === cap ? 0 : i + 1;
    }
  }

  private resize(cap: number): void {
    const oldPair = this.pair;
    const oldTop = this.top;
    this.cap = cap;
    this.pair = new Uint32Array(cap * 2);
    this.top = new Uint16Array(cap);
    for (let o = 0; o < oldTop.length; o++) {
      if (oldTop[o] === 0) continue;
      const hv = oldPair[2 * o + 1];
      this.place(oldPair[2 * o], hv & HI_MASK, (hv >>> 20) | ((oldTop[o] - 1) << 12));
    }
  }
}

/** A value past 28 bits would be stored wrong: refuse it (the index checks before it gets here). */
function checkValue(value: number): void {
  if (!(value >= 0 && value <= MAX_VALUE)) throw new RangeError(`EngineBlockMap value ${value} out of range`);
}
