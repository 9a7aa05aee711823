/**
 * Compact open-addressing hash tables on typed arrays (linear probing, backward-shift deletion,
 * so no tombstones build up under the store/evict churn of a KV cache). A JS Map costs ~50-80
 * bytes per entry; these cost 4 (set) and 12 (map) bytes per slot at ≤ 80% load, which is what
 * keeps the index's per-rank engine-hash maps at 12 bytes per slot.
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

/** Highest load of an F64U32Map: Robin Hood probing keeps lookups short this full. */
const MAP_MAX_LOAD = 0.92;
/** Growth factor past the expected size (not a power of two: the capacity is any size). */
const MAP_GROWTH = 1.5;

/** Slots for `n` keys at the map's highest load. */
function mapCapacityFor(n: number): number {
  return Math.max(MIN_CAP, Math.ceil(n / MAP_MAX_LOAD) + 1);
}

/**
 * Map from a numeric key (an engine's block hash folded to a double; never -Infinity) to a
 * uint32 value (the index stores the block's entry id in the fleet-wide BlockTable).
 *
 * One per worker rank and 12 bytes a slot (Float64 key + Uint32 value): at 1,000 ranks × 100k
 * blocks these maps are most of the index, so they run full: Robin Hood linear probing up to
 * 92 % load, with a capacity of any size (a key's home slot is its 32-bit mix scaled to the
 * capacity, not masked), so a rank sized for its pool ends near 92 % instead of at whatever a
 * power of two leaves (100k blocks in 131,072 slots: 76 %). A key never sits farther from its
 * home than a key it passed, so a lookup of an absent key stops at the first slot whose key is
 * nearer its own home than the probe is. Deletion shifts the run back (no tombstones).
 */
export class F64U32Map {
  private keys: Float64Array;
  private vals: Uint32Array;
  private cap: number;
  size = 0;

  constructor(expected = 0) {
    this.cap = mapCapacityFor(expected);
    this.keys = new Float64Array(this.cap).fill(EMPTY);
    this.vals = new Uint32Array(this.cap);
  }

  /** The home slot of `key`. */
  private home(key: number): number {
    // mix < 2^32, so mix × cap < cap × 2^32: exact below 2^53, and above it the rounding error
    // (under cap × 2^-21) cannot reach cap × 2^32, which is at least cap away.
    return Math.floor((mixDouble(key) * this.cap) / 4294967296);
  }

  /** Slot of `key`, or -1. */
  find(key: number): number {
    const keys = this.keys;
    const cap = this.cap;
    let i = this.home(key);
    for (let d = 0; ; d++) {
      const s = keys[i];
      if (s === key) return i;
      if (s === EMPTY) return -1;
      // Robin Hood: `key` would have displaced a key nearer its home than d.
      if (d > 0) {
        const h = this.home(s);
        if ((i - h + cap) % cap < d) return -1;
      }
      i = i + 1 === cap ? 0 : i + 1;
    }
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
    this.insertNew(key, value);
    return true;
  }

  /** Inserts a key known to be absent (after a failed `find`). */
  insertNew(key: number, value: number): void {
    if (this.size + 1 > this.cap * MAP_MAX_LOAD) this.resize(Math.ceil(this.cap * MAP_GROWTH));
    this.place(key, value);
    this.size++;
  }

  /** Overwrites the value at `slot` (from `find`). */
  setAt(slot: number, value: number): void {
    this.vals[slot] = value;
  }

  /** Removes the key at `slot` (from `find`): the keys after it that are not at home move back one. */
  deleteAt(slot: number): void {
    const keys = this.keys;
    const vals = this.vals;
    const cap = this.cap;
    let i = slot;
    for (;;) {
      const j = i + 1 === cap ? 0 : i + 1;
      const s = keys[j];
      if (s === EMPTY || this.home(s) === j) break;
      keys[i] = s;
      vals[i] = vals[j];
      i = j;
    }
    keys[i] = EMPTY;
    this.size--;
  }

  /** Calls `fn` with every value (e.g. to release what a rank held before clearing it). */
  forEachValue(fn: (value: number) => void): void {
    const keys = this.keys;
    const vals = this.vals;
    for (let i = 0; i < keys.length; i++) if (keys[i] !== EMPTY) fn(vals[i]);
  }

  clear(): void {
    this.cap = MIN_CAP;
    this.keys = new Float64Array(MIN_CAP).fill(EMPTY);
    this.vals = new Uint32Array(MIN_CAP);
    this.size = 0;
  }

  bytes(): number {
    return this.keys.byteLength + this.vals.byteLength;
  }

  private place(key: number, value: number): void {
    const keys = this.keys;
    const vals = this.vals;
    const cap = this.cap;
    let k = key;
    let v = value;
    let i = this.home(k);
    for (let d = 0; ; d++) {
      const s = keys[i];
      if (s === EMPTY) {
        keys[i] = k;
        vals[i] = v;
        return;
      }
      const sd = (i - this.home(s) + cap) % cap;
      if (sd < d) {
        // Take the slot from a key nearer its home, and carry that one on.
        keys[i] = k;
        const sv = vals[i];
        vals[i] = v;
        k = s;
        v = sv;
        d = sd;
      }
      i = i + 1 === cap ? 0 : i + 1;
    }
  }

  private resize(cap: number): void {
    const oldK = this.keys;
    const oldV = this.vals;
    this.cap = cap;
    this.keys = new Float64Array(cap).fill(EMPTY);
    this.vals = new Uint32Array(cap);
    for (let o = 0; o < oldK.length; o++) if (oldK[o] !== EMPTY) this.place(oldK[o], oldV[o]);
  }
}
