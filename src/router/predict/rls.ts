/**
 * Recursive least squares with exponential forgetting, in relative-error form: the online fit
 * behind the TTFT predictor (./ttft.ts).
 *
 * Why RLS: TTFT on a continuous-batching engine is close to linear in the work ahead of the
 * request's first token (its own uncached prompt, the prompts queued before it, the batch it
 * shares each step with), with coefficients that are the worker's speed. RLS fits such a line
 * exactly from the first few samples (no calibration run), costs O(d²) per sample (d = 4), and
 * its forgetting factor λ discounts a sample by λ per newer one, so a worker that becomes slower
 * (another quantization, another GPU, a noisy neighbour) is re-fitted within ~1/(1 − λ) requests
 * instead of averaging the old speed in forever. An EWMA of a per-token time cannot separate a
 * fixed overhead from a per-token cost, nor queue wait from own prefill.
 *
 * Relative form: each sample (x, y) is scaled by 1/y before the update, so the fit minimises the
 * squared *relative* error — what the goal measures — instead of letting a few long
 * TTFTs decide the line. Each scaled residual is clipped to ±`clip` (a preempted request's
 * TTFT does not drag the line), and the covariance's trace is capped (a feature that never
 * varies, e.g. an engine queue that stays 0, would otherwise blow up as P/λⁿ and make the next
 * sample that moves it swing the fit).
 *
 * Change detection: in relative form a worker that became 4× slower sends samples that weigh
 * 16× less than its old ones, so forgetting alone re-fits slowly (40 samples after a 4× slowdown
 * the median error was still 58 %). An EWMA of the signed relative residual watches for a
 * persistent bias; past `resetBias` the covariance is reset to its prior (the coefficients kept),
 * the classic covariance-resetting RLS, and the next few samples re-fit the line.
 */

export interface RlsOptions {
  /** Forgetting factor λ in (0, 1]; memory ~1/(1 − λ) samples. */
  lambda: number;
  /** Initial covariance diagonal (prior variance of each coefficient; larger = learns faster). */
  p0: number;
  /** Clip of the scaled (relative) residual. */
  clip: number;
  /** Floor of y when scaling by 1/y (TTFT units), so a near-zero sample cannot dominate. */
  yFloor: number;
  /** |EWMA of the signed relative residual| that resets the covariance (a speed change). */
  resetBias: number;
}

/**
 * resetBias 0.5, not 0.25: behind an admission queue that lets a request through only when its
 * prediction is within the target, the requests learnt from are the under-predicted ones, a
 * persistent signed residual of ~0.3 that at 0.25 read as a speed change and reset the
 * covariance every ~30 samples, so the fit stayed in its noisy just-reset state (bench/
 * fleet-routing Run K: 10 resets in 280 samples). A 4× slowdown (residual 0.75) still passes 0.5
 * within a few samples.
 */
export const DEFAULT_RLS: RlsOptions = { lambda: 0.97, p0: 1e6, clip: 2, yFloor: 1, resetBias: 0.5 };

/** Weight of the newest residual in the bias EWMA. */
const BIAS_ALPHA = 0.2;

export class Rls {
  readonly d: number;
  readonly theta: Float64Array;
  private readonly p: Float64Array;
  private readonly o: RlsOptions;
  private readonly maxTrace: number;
  /** Samples seen (lifetime). */
  samples = 0;
  /** Covariance resets (speed changes detected). */
  resets = 0;
  private bias = 0;
  private readonly px: Float64Array;

  constructor(d: number, o: RlsOptions = DEFAULT_RLS, prior?: ArrayLike<number>) {
    this.d = d;
    this.o = o;
    this.theta = new Float64Array(d);
    if (prior) for (let i = 0; i < d; i++) this.theta[i] = prior[i] ?? 0;
    this.p = new Float64Array(d * d);
    for (let i = 0; i < d; i++) this.p[i * d + i] = o.p0;
    this.maxTrace = o.p0 * d;
    this.px = new Float64Array(d);
  }

  predict(x: ArrayLike<number>): number {
    let s = 0;
    for (let i = 0; i < this.d; i++) s += this.theta[i] * x[i];
    return s;
  }

  /** Learns one observation `y` (> 0) of features `x`. */
  update(x: ArrayLike<number>, y: number): void {
    const d = this.d;
    const p = this.p;
    const s = 1 / Math.max(y, this.o.yFloor);
    // Scaled sample: x' = x·s, y' = y·s.
    const xs = new Float64Array(d);
    for (let i = 0; i < d; i++) xs[i] = x[i] * s;
    let denom = this.o.lambda;
    for (let i = 0; i < d; i++) {
      let v = 0;
      for (let j = 0; j < d; j++) v += p[i * d + j] * xs[j];
      this.px[i] = v;
      denom += xs[i] * v;
    }
    let e = y * s;
    for (let i = 0; i < d; i++) e -= this.theta[i] * xs[i];
    this.bias += BIAS_ALPHA * (Math.max(-1, Math.min(1, e)) - this.bias);
    if (this.samples >= 8 && Math.abs(this.bias) > this.o.resetBias) {
      this.bias = 0;
      this.resets++;
      p.fill(0);
      for (let i = 0; i < d; i++) p[i * d + i] = this.o.p0;
      denom = this.o.lambda;
      for (let i = 0; i < d; i++) {
        this.px[i] = this.o.p0 * xs[i];
        denom += xs[i] * this.px[i];
      }
    }
    if (e > this.o.clip) e = this.o.clip;
    else if (e < -this.o.clip) e = -this.o.clip;
    for (let i = 0; i < d; i++) this.theta[i] += (this.px[i] / denom) * e;
    // P ← (P − k·xᵀP)/λ with k = Px/denom (P symmetric: xᵀP = (Px)ᵀ).
    let trace = 0;
    for (let i = 0; i < d; i++)
      for (let j = 0; j < d; j++) {
        const v = (p[i * d + j] - (this.px[i] * this.px[j]) / denom) / this.o.lambda;
        p[i * d + j] = v;
        if (i === j) trace += v;
      }
    if (trace > this.maxTrace) {
      const f = this.maxTrace / trace;
      for (let i = 0; i < d * d; i++) p[i] *= f;
    }
    this.samples++;
  }
}
