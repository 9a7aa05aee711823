/**
 * Per-decision scratch rows (issue #32). A decision over N candidates fills a dozen per-candidate
 * rows (block sizes, loads, overlaps, ranks, held blocks …). Past 64 bytes (8 doubles, 16
 * int32s) V8 gives a typed array its own off-heap backing store: at 256 workers each `new Float64Array(256)` cost ≈ 1.2 µs
 * with its share of GC on Node 24 (measured in a loop of 1e6), about a quarter of the decision.
 * A `RowArena` carves zeroed views out of one buffer it keeps across decisions instead, so the
 * only allocation per row is the small view object.
 *
 * Lifetime: `reset` reuses the memory, so a row is valid until its arena's next reset. A step
 * alternates two arenas (scheduler.ts), so the rows of decision k stay intact through decision
 * k + 1, for `onRouted` and for anything reading the previous decision while the next one runs.
 * Nothing may keep a row past that: copy it (the decision log and traces do).
 */
export class RowArena {
  private buf: ArrayBuffer;
  private top = 0;

  constructor(bytes = 64 * 1024) {
    this.buf = new ArrayBuffer(bytes);
  }

  /** Starts a decision: every earlier row of this arena may be overwritten from now on. */
  reset(): void {
    this.top = 0;
  }

  /** A zeroed row of `n` 32-bit integers. */
  i32(n: number): Int32Array {
    const at = this.take(n * 4);
    return new Int32Array(this.buf, at, n).fill(0);
  }

  /** A zeroed row of `n` doubles. */
  f64(n: number): Float64Array {
    const at = this.take(n * 8);
    return new Float64Array(this.buf, at, n).fill(0);
  }

  /** A zeroed row of `n` bytes. */
  u8(n: number): Uint8Array {
    const at = this.take(n);
    return new Uint8Array(this.buf, at, n).fill(0);
  }

  /** Reserves `bytes` (8-aligned) and returns their offset; a full buffer is replaced by a larger one (rows already taken keep the old). */
  private take(bytes: number): number {
    const size = (bytes + 7) & ~7;
    if (this.top + size > this.buf.byteLength) {
      this.buf = new ArrayBuffer(Math.max(2 * this.buf.byteLength, 2 * size));
      this.top = 0;
    }
    const at = this.top;
    this.top += size;
    return at;
  }
}
