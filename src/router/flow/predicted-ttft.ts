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
 * Features are the predictor's: the prompt's tokens not cached on the candidate (from the routing
 * policy's overlap source, `HeadroomRequest.cachedTokens`, as the pipeline's plugins see them;
 * else the whole prompt), this replica's prefill backlog, the engine's queue and batch. The
 * predictor is the server's, shared with the pipeline's `predicted-ttft` scorer and
 * `ttft-saturation` filter, which learn from each routed request's first byte; when the profile
 * has neither, this signal learns itself, at the request's first token (`onFirstToken`;
 * `observeOnce`: never twice for one request). Not at its end: under overload the end came 20–30 s
 * wall after the first token, so the fit lagged the queue it was to bound by that much and
 * admitted on a line learnt while the engines were still empty (bench/fleet-routing Run K).
 */
import { z } from "zod";
import { FEATURES, featuresFrom, predictorOf } from "../predict/ttft.ts";
import type { WorkerState } from "../types.ts";
import { defineHeadroom, type HeadroomFirstToken, type HeadroomRequest } from "./headroom.ts";

/** How long a request's cached-token reading is reused across checks, ms (the index moves slowly). */
const CACHED_READ_MS = 50;

interface CachedRead {
  at: number;
  of: readonly WorkerState[];
  tokens: readonly number[] | null;
}

/** Per candidate, the prompt's tokens not cached there (the whole prompt where unknown). */
function uncachedOf(
  req: HeadroomRequest,
  candidates: readonly WorkerState[],
  reads: WeakMap<HeadroomRequest, CachedRead>,
): (i: number) => number {
  const given = req.uncachedTokens;
  if (given) return (i) => given[i] ?? req.promptTokens;
  if (!req.cachedTokens) return () => req.promptTokens;
  const now = performance.now();
  let r = reads.get(req);
  if (!r || r.of !== candidates || now - r.at >= CACHED_READ_MS) {
    r = { at: now, of: candidates, tokens: req.cachedTokens(candidates) };
    reads.set(req, r);
  }
  const t = r.tokens;
  return (i) => Math.max(0, req.promptTokens - (t?.[i] ?? 0));
}

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
    const reads = new WeakMap<HeadroomRequest, CachedRead>();
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
        const uncached = uncachedOf(req, candidates, reads);
        for (let i = 0; i < candidates.length; i++) {
          const ms = predict(candidates[i], uncached(i));
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
        // The worker's uncached prompt as the checks saw it (their reading, when recent).
        const seen = reads.get(req)?.of;
        const at = seen ? seen.indexOf(worker) : -1;
        const uncached =
          seen && at >= 0 ? uncachedOf(req, seen, reads)(at) : uncachedOf(req, [worker], reads)(0);
        const f = featuresFrom(uncached, worker, new Float64Array(FEATURES));
        const predicted = predictor.predictFeatures(scope.model, worker.record.id, f);
        pending.set(req.requestId, { worker: worker.record.id, x: f, predicted });
        if (pending.size > 4096) pending.delete(pending.keys().next().value!);
      },
      onFirstToken(o: HeadroomFirstToken) {
        const d = pending.get(o.requestId);
        pending.delete(o.requestId);
        if (!d) return;
        // Learnt here (no pipeline plugin followed it): its error goes to the server's histogram
        // (infera_ttft_prediction_relative_error) like the pipeline's, step "flow".
        if (predictor.observeOnce(scope.model, d.worker, o.requestId, d.x, o.ttftMs))
          predictor.sink?.observed(scope.model, o.requestId, "flow", d.predicted, o.ttftMs);
      },
      observe(o) {
        // Ended without a first token (failed, cancelled, not streamed): nothing to learn.
        pending.delete(o.requestId);
      },
      onWorkerRemoved(id) {
        predictor.forget(id);
      },
    };
  },
});
