// Frozen copy of src/kv/tables.ts before the one-walk rewrite (bench/kv-index baseline); do not edit.
/**
 * Compact open-addressing hash tables on typed arrays (linear probing, backward-shift deletion,
 * so no tombstones build up under the store/evict churn of a KV cache). A JS Map costs ~50-80
 * bytes per entry; these cost 4 (set) and 12 (map) bytes per slot at ≤ 80% load, which is what
 * lets the index hold 1,000 workers × 100k blocks in under 2 GiB.
 */

const MAX_LOAD = 0.8;
const MIN_CAP = 16;

function capacityFor(n: number): number {
  let cap = MIN_CAP;
  while (n > cap * MAX_LOAD) cap *= 2;
  return cap;
}

/** 0 marks an empty slot, so a key of 0 is stored as 1 (a 2^-32 collision, harmless here). */
function nz(k: number): number {
  return k >>> 0 || 1;
}

/**
 * A multiset of 32-bit keys that are already well mixed (block hashes): the slot is the low bits.
 * Duplicates are kept, so two blocks that share a router hash on one worker are counted twice and
 * removing one leaves the other.
 */
export class U32MultiSet {
  private slots: Uint32Array;
  private mask: number;
  size = 0;

  constructor(expected = 0) {
    this.slots = new Uint32Array(capacityFor(expected));
    this.mask = this.slots.length - 1;
  }

  add(key: number): void {
    if (this.size + 1 > this.slots.length * MAX_LOAD) this.resize(this.slots.length * 2);
    const k = nz(key);
    const slots = this.slots;
    const mask = this.mask;
    let i = k & mask;
    while (slots[i] !== 0) i = (i + 1) & mask;
    slots[i] = k;
    this.size++;
  }

  has(key: number): boolean {
    const k = nz(key);
    const slots = this.slots;
    const mask = this.mask;
    let i = k & mask;
    let s = slots[i];
    while (s !== 0) {
      if (s === k) return true;
      i = (i + 1) & mask;
      s = slots[i];
    }
    return false;
  }

  /** Removes one occurrence; false when absent. */
  delete(key: number): boolean {
    const k = nz(key);
    const slots = this.slots;
    const mask = this.mask;
    let i = k & mask;
    for (;;) {
      const s = slots[i];
      if (s === 0) return false;
      if (s === k) break;
      i = (i + 1) & mask;
    }
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const s = slots[j];
      if (s === 0) break;
      const home = s & mask;
      // Move s back into the hole unless its home lies cyclically in (i, j].
      if (((j - home) & mask) >= ((j - i) & mask)) {
        slots[i] = s;
        i = j;
      }
    }
    slots[i] = 0;
    this.size--;
    return true;
  }

  clear(): void {
    this.slots = new Uint32Array(MIN_CAP);
    this.mask = MIN_CAP - 1;
    this.size = 0;
  }

  bytes(): number {
    return this.slots.byteLength;
  }

  private resize(cap: number): void {
    const old = this.slots;
    this.slots = new Uint32Array(cap);
    this.mask = cap - 1;
    const slots = this.slots;
    const mask = this.mask;
    for (let o = 0; o < old.length; o++) {
      const k = old[o];
      if (k === 0) continue;
      let i = k & mask;
      while (slots[i] !== 0) i = (i + 1) & mask;
      slots[i] = k;
    }
  }
}

const EMPTY = Number.NEGATIVE_INFINITY;
const f64 = new Float64Array(1);
const f64w = new Uint32Array(f64.buffer);

function mixDouble(k: number): number {
  f64[0] = k;
  let h = f64w[0] ^ Math.imul(f64w[1], 0x9e3779b1);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * Map from a numeric key (an engine's block hash folded to a double; never -Infinity) to a
 * uint32 value (the router's hash of that block).
 */
export class F64U32Map {
  private keys: Float64Array;
  private vals: Uint32Array;
  private mask: number;
  size = 0;

  constructor(expected = 0) {
    const cap = capacityFor(expected);
    this.keys = new Float64Array(cap).fill(EMPTY);
    this.vals = new Uint32Array(cap);
    this.mask = cap - 1;
  }

  /** Slot of `key`, or -1. */
  find(key: number): number {
    const keys = this.keys;
    const mask = this.mask;
    let i = mixDouble(key) & mask;
    let s = keys[i];
    while (s !== EMPTY) {
      if (s === key) return i;
      i = (i + 1) & mask;
      s = keys[i];
    }
    return -1;
  }

  valueAt(slot: number): number {
    return this.vals[slot];
  }

  /** Inserts or overwrites; returns true when the key was new. */
  set(key: number, value: number): boolean {
    const at = this.find(key);
    if (at >= 0) {
      this.vals[at] = value;
      return false;
    }
    if (this.size + 1 > this.keys.length * MAX_LOAD) this.resize(this.keys.length * 2);
    this.place(key, value);
    this.size++;
    return true;
  }

  /** Inserts a key known to be absent (after a failed `find`), skipping the second probe. */
  insertNew(key: number, value: number): void {
    if (this.size + 1 > this.keys.length * MAX_LOAD) this.resize(this.keys.length * 2);
    this.place(key, value);
    this.size++;
  }

  /** Overwrites the value at `slot` (from `find`). */
  setAt(slot: number, value: number): void {
    this.vals[slot] = value;
  }

  /** Removes the key at `slot` (from `find`). */
  deleteAt(slot: number): void {
    const keys = this.keys;
    const vals = this.vals;
    const mask = this.mask;
    let i = slot;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const s = keys[j];
      if (s === EMPTY) break;
      const home = mixDouble(s) & mask;
      if (((j - home) & mask) >= ((j - i) & mask)) {
        keys[i] = s;
        vals[i] = vals[j];
        i = j;
      }
    }
    keys[i] = EMPTY;
    this.size--;
  }

  clear(): void {
    this.keys = new Float64Array(MIN_CAP).fill(EMPTY);
    this.vals = new Uint32Array(MIN_CAP);
    this.mask = MIN_CAP - 1;
    this.size = 0;
  }

  bytes(): number {
    return this.keys.byteLength + this.vals.byteLength;
  }

  private place(key: number, value: number): void {
    const keys = this.keys;
    const mask = this.mask;
    let i = mixDouble(key) & mask;
    while (keys[i] !== EMPTY) i = (i + 1) & mask;
    keys[i] = key;
    this.vals[i] = value;
  }

  private resize(cap: number): void {
    const oldK = this.keys;
    const oldV = this.vals;
    this.keys = new Float64Array(cap).fill(EMPTY);
    this.vals = new Uint32Array(cap);
    this.mask = cap - 1;
    for (let o = 0; o < oldK.length; o++) if (oldK[o] !== EMPTY) this.place(oldK[o], oldV[o]);
  }
}
