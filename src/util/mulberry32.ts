/**
 * mulberry32: a tiny, fast, seedable PRNG with one 32-bit word of state. The load generator's
 * `Prng` (src/loadgen/prng.ts, which mixes its seed first) and the sim's per-sequence output
 * streams (src/engine/sim) both draw from it; the same seed gives the same stream everywhere.
 */
export class Mulberry32 {
  protected state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** Uniform in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
}
