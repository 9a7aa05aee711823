/**
 * The TTFT predictor: one online model per worker, fitted from what this server observes, with
 * no calibration run (issue #29 item 4). One per server (`app.ts`), shared by every model's
 * scheduler through `ModelScope.ttft`; state is keyed by worker id.
 *
 * Features of a candidate at decision time (`featuresOf`), all things the server already has:
 *   1                              fixed cost (a forward pass, the network, the relay)
 *   prefill work / 1000            the request's own uncached prompt (prompt minus the step's
 *                                  overlap) plus this server's prompts on the worker not yet past
 *                                  their first token (`pendingPrefillTokens`: the queue ahead of
 *                                  it) — one feature: both are tokens the engine prefills before
 *                                  this first token, at the same per-token cost
 *   engine waiting / 8             the engine's own queue (scraped `/metrics`, all replicas)
 *   engine running / 32            the batch each prefill step shares
 * Why own prompt and backlog are one feature (bench/fleet-routing Run K): fitted separately, the
 * first samples (taken while the backlog is small) teach the per-token cost on the own prompt
 * only, and the line then under-predicts the backlog that builds under overload; on a logged
 * 2×-capacity replay the merged feature cut the open-loop median relative error from 0.62 to 0.50
 * (0.39 with the change detector at 0.5, below).
 * The label is the observed TTFT: from routing to the first byte of a streamed answer (the
 * dispatch claim's `prefilled`). A non-streamed answer's first byte is its last, so it teaches
 * nothing and is not learnt from.
 *
 * The fit is RLS with forgetting in relative-error form (./rls.ts, why there). A worker with no
 * samples yet starts from the model-wide pooled fit (every worker's samples), so a new worker is
 * predicted like its peers until its own samples say otherwise; before any sample at all there
 * is no prediction (`NaN`) and users treat the worker as unknown (no cost, no saturation).
 */
import type { RouteLifecycle, RoutingRequest, WorkerState } from "../types.ts";
import { DEFAULT_RLS, Rls, type RlsOptions } from "./rls.ts";

export const FEATURES = 4;

/** Where a prediction and its outcome go (the server's metrics and decision log). */
export interface TtftSink {
  /** A routed request's prediction per candidate position of its step (NaN: none). */
  predicted?(requestId: string, step: string, perCandidate: Float64Array): void;
  /** Its observed TTFT, with the winner's prediction (NaN when there was none). */
  observed(model: string, requestId: string, step: string, predictedMs: number, observedMs: number): void;
}

/** What a step context offers the predictor (a subset of the pipeline's StepContext). */
export interface FeatureSource {
  readonly req: RoutingRequest;
  readonly step: string;
  readonly all: readonly WorkerState[];
  overlaps(): Int32Array;
  blockSize(pos: number): number;
}

export interface TtftPredictorOptions {
  rls?: Partial<RlsOptions>;
  /** Samples a worker needs before its own fit replaces the pooled one (default 4). */
  minSamples?: number;
  sink?: TtftSink;
}

interface WorkerModel {
  rls: Rls;
}

/** Features of candidate `pos` (written into `out`). */
export function featuresOf(src: FeatureSource, pos: number, out: Float64Array): Float64Array {
  const prompt = src.req.promptTokens().length;
  const cached = src.overlaps()[pos] * src.blockSize(pos);
  return featuresFrom(prompt - cached, src.all[pos], out);
}

/** Features from raw values (the flow queue's signal has no step context): see `featuresOf`. */
export function featuresFrom(uncachedTokens: number, w: WorkerState, out: Float64Array): Float64Array {
  out[0] = 1;
  out[1] = (Math.max(0, uncachedTokens) + Math.max(0, w.pendingPrefillTokens)) / 1000;
  out[2] = (w.engineLoad?.waiting ?? 0) / 8;
  out[3] = (w.engineLoad?.running ?? 0) / 32;
  return out;
}

export class TtftPredictor {
  private readonly rlsOpts: RlsOptions;
  private readonly minSamples: number;
  private readonly workers = new Map<string, WorkerModel>();
  private readonly pooled = new Map<string, Rls>();
  /**
   * Per step context: predictions and features per candidate position, computed once for every
   * plugin, before the winner's claim adds this request to its backlog.
   */
  private readonly perCtx = new WeakMap<object, { preds: Float64Array; xs: Float64Array }>();
  /** Requests being learnt from (one watcher each, whichever plugin asked first). */
  private readonly tracked = new Set<string>();
  /** The last requests learnt from (so another path, the flow queue's signal, skips them). */
  private readonly learnt = new Set<string>();
  private readonly learntOrder: string[] = [];
  sink: TtftSink | undefined;

  constructor(o: TtftPredictorOptions = {}) {
    this.rlsOpts = { ...DEFAULT_RLS, ...o.rls };
    this.minSamples = o.minSamples ?? 4;
    this.sink = o.sink;
  }

  private pool(model: string): Rls {
    let r = this.pooled.get(model);
    if (!r) {
      r = new Rls(FEATURES, this.rlsOpts);
      this.pooled.set(model, r);
    }
    return r;
  }

  /** Predicted TTFT (ms) of features `x` on worker `id` of `model`; NaN when nothing is known yet. */
  predictFeatures(model: string, id: string, x: Float64Array): number {
    const own = this.workers.get(id);
    const rls = own && own.rls.samples >= this.minSamples ? own.rls : this.pooled.get(model);
    if (!rls || rls.samples === 0) return Number.NaN;
    // A fit is a line through noisy samples: never below a millisecond.
    return Math.max(1, rls.predict(x));
  }

  /** Predicted TTFT (ms) per candidate position of the step (NaN: unknown), computed once per context. */
  predictions(src: FeatureSource): Float64Array {
    return this.computed(src).preds;
  }

  private computed(src: FeatureSource): { preds: Float64Array; xs: Float64Array } {
    const hit = this.perCtx.get(src);
    if (hit) return hit;
    const n = src.all.length;
    const preds = new Float64Array(n);
    const xs = new Float64Array(n * FEATURES);
    for (let i = 0; i < n; i++) {
      const x = featuresOf(src, i, xs.subarray(i * FEATURES, (i + 1) * FEATURES));
      preds[i] = this.predictFeatures(src.req.model, src.all[i].record.id, x);
    }
    const c = { preds, xs };
    this.perCtx.set(src, c);
    return c;
  }

  /** Learns one observation of worker `id` (also into the model's pooled fit). */
  observe(model: string, id: string, x: Float64Array, ttftMs: number): void {
    if (!(ttftMs > 0) || !Number.isFinite(ttftMs)) return;
    let m = this.workers.get(id);
    if (!m) {
      // Start from the pooled line: a new worker is assumed to be like its peers.
      m = { rls: new Rls(FEATURES, this.rlsOpts, this.pooled.get(model)?.theta) };
      this.workers.set(id, m);
    }
    m.rls.update(x, ttftMs);
    this.pool(model).update(x, ttftMs);
  }

  /**
   * Follows a routed request's first byte and learns from it (streamed requests only; once per
   * request, whichever plugin calls first). `ctx` is the step that chose `worker`.
   */
  track(src: FeatureSource, worker: WorkerState, route: RouteLifecycle | undefined): void {
    const req = src.req;
    if (!route || !req.stream || this.tracked.has(req.requestId)) return;
    const pos = src.all.indexOf(worker);
    if (pos < 0) return;
    const { preds, xs } = this.computed(src);
    this.sink?.predicted?.(req.requestId, src.step, preds);
    const predicted = preds[pos];
    const x = xs.slice(pos * FEATURES, (pos + 1) * FEATURES);
    const t0 = performance.now();
    const id = req.requestId;
    this.tracked.add(id);
    route.watch({
      prefilled: () => {
        this.tracked.delete(id);
        this.noteLearnt(id);
        const ms = performance.now() - t0;
        this.observe(req.model, worker.record.id, x, ms);
        this.sink?.observed(req.model, id, src.step, predicted, ms);
      },
      dropped: () => {
        this.tracked.delete(id);
      },
    });
  }

  private noteLearnt(id: string): void {
    this.learnt.add(id);
    this.learntOrder.push(id);
    if (this.learntOrder.length > 4096) this.learnt.delete(this.learntOrder.shift()!);
  }

  /**
   * Learns request `requestId`'s TTFT on worker `id` unless a pipeline plugin already did (or
   * is following it): for callers that see the outcome but not the claim (the flow queue's
   * headroom signal, when no pipeline plugin of the profile uses the predictor).
   */
  observeOnce(model: string, id: string, requestId: string, x: Float64Array, ttftMs: number): boolean {
    if (this.tracked.has(requestId) || this.learnt.has(requestId)) return false;
    this.noteLearnt(requestId);
    this.observe(model, id, x, ttftMs);
    return true;
  }

  /** Samples learnt for worker `id` (0 when unknown). */
  samplesOf(id: string): number {
    return this.workers.get(id)?.rls.samples ?? 0;
  }

  /** The worker's fitted coefficients (ms per feature unit), for logs and tests. */
  coefficientsOf(id: string): number[] | null {
    const m = this.workers.get(id);
    return m ? Array.from(m.rls.theta) : null;
  }

  forget(id: string): void {
    this.workers.delete(id);
  }
}

/** The predictor of a scope: the server's when it gave one, else one per model (tests, tools). */
export function predictorOf(scope: {
  ttft?: TtftPredictor;
  shared<T>(key: string, make: () => T): T;
}): TtftPredictor {
  return scope.ttft ?? scope.shared("ttft-predictor", () => new TtftPredictor());
}
