/**
 * predicted-ttft (headroom signal, issue #29 items 1 and 4): a candidate has headroom while the
 * server's TTFT predictor (src/router/predict/ttft.ts) predicts this request's TTFT there within
 * its target (`targetTtftMs`: the `x-infera-ttft-target-ms` header or the flow config, else this
 * signal's `targetMs`). No target: it fits. No prediction for a candidate yet (the fit has no
 * sample): it fits while this replica has fewer than `coldInFlight` requests on it — not
 * unconditionally: a fit learns from first tokens, which come one TTFT after dispatch, and
 * under overload from a cold start everything that arrived meanwhile was let through blind
 * (bench/fleet-routing Run I/J: kv-aware+flow-ttft admitted nearly everything, every one of its
 * dispatches predicted NaN). When none fits, the request waits; the estimate of the wait is the
 * smallest predicted excess over the target.
 *
 * Features are the predictor's (uncached prompt tokens when the queue knows them, else the whole
 * prompt; this replica's prefill backlog; the engine's queue and batch). The predictor is the
 * server's, shared with the pipeline's `predicted-ttft` scorer and `ttft-saturation` filter, which
 * learn from each routed request's first byte; when the profile has neither, this signal learns
 * from the queue's observations itself (`observeOnce`: never twice for one request).
 */
import { z } from "zod";
import { FEATURES, featuresFrom, predictorOf } from "../predict/ttft.ts";
import type { WorkerState } from "../types.ts";
import { defineHeadroom, type HeadroomObservation } from "./headroom.ts";

const params = z
  .object({
    /** Target (ms) for requests the header and the flow config give none. */
    targetMs: z.number().positive().optional(),
    /** The least wait (ms) a blocked request is told to expect (Retry-After's floor). */
    minWaitMs: z.number().int().min(1).default(50),
    /** With no prediction yet, a worker has headroom below this many of this replica's requests in flight. */
    coldInFlight: z.number().int().min(1).default(2),
  })
  .strict();

export default defineHeadroom("predicted-ttft", {
  doc: "headroom while the request's predicted TTFT on a worker is within its target (the online per-worker predictor)",
  params,
  needs: ["engineLoad"],
  create: (scope, p) => {
    const predictor = predictorOf(scope);
    /** Features at dispatch, per request, until its observation comes (bounded). */
    const pending = new Map<string, { worker: string; x: Float64Array; predicted: number }>();
    const x = new Float64Array(FEATURES);
    const predict = (w: WorkerState, uncached: number): number =>
      predictor.predictFeatures(scope.model, w.record.id, featuresFrom(uncached, w, x));
    return {
      name: "predicted-ttft",
      needs: ["engineLoad"],
      check(req, candidates) {
        const target = req.targetTtftMs ?? p.targetMs;
        const all = candidates.map((_, i) => i);
        if (target === undefined) return { fits: all };
        const fits: number[] = [];
        let excess = Number.POSITIVE_INFINITY;
        for (let i = 0; i < candidates.length; i++) {
          const ms = predict(candidates[i], req.uncachedTokens?.[i] ?? req.promptTokens);
          if (Number.isNaN(ms)) {
            if (candidates[i].inFlight < p.coldInFlight) fits.push(i);
          } else if (!(ms > target)) fits.push(i);
          else excess = Math.min(excess, ms - target);
        }
        if (fits.length > 0) return { fits };
        const wait = Number.isFinite(excess) ? Math.ceil(excess) : p.minWaitMs;
        return { fits, waitMs: Math.max(p.minWaitMs, wait), reason: "ttft" };
      },
      onDispatched(req, worker) {
        const f = featuresFrom(req.promptTokens, worker, new Float64Array(FEATURES));
        const predicted = predictor.predictFeatures(scope.model, worker.record.id, f);
        pending.set(req.requestId, { worker: worker.record.id, x: f, predicted });
        if (pending.size > 4096) pending.delete(pending.keys().next().value!);
      },
      observe(o: HeadroomObservation) {
        const d = pending.get(o.requestId);
        pending.delete(o.requestId);
        if (!d || o.ttftMs === undefined || !o.ok) return;
        if (o.uncachedTokens !== undefined) d.x[1] = o.uncachedTokens / 1000;
        // Learnt here (no pipeline plugin followed it): its error goes to the server's histogram
        // (infera_ttft_prediction_relative_error) like the pipeline's, step "flow".
        if (predictor.observeOnce(scope.model, d.worker, o.requestId, d.x, o.ttftMs))
          predictor.sink?.observed(scope.model, o.requestId, "flow", d.predicted, o.ttftMs);
      },
      onWorkerRemoved(id) {
        predictor.forget(id);
      },
    };
  },
});
