/**
 * predicted-ttft: the TTFT each candidate is predicted to give this request, `weight × ms`, from
 * the server's online per-worker predictor (src/router/predict/ttft.ts: uncached prompt tokens,
 * this server's prefill backlog there, the engine's queue and batch). It also teaches the
 * predictor: each routed streamed request's first byte is a sample for its worker.
 *
 * A candidate with no prediction yet (nothing learnt anywhere for the model) costs the least of
 * the known ones, so a new worker is tried rather than avoided; with none known all cost 0. Put
 * a `kv-prefix` scorer in the same profile to give it the prefix overlap (its overlap source);
 * without one every prompt counts as uncached.
 */
import { z } from "zod";
import { predictorOf } from "../../predict/ttft.ts";
import { defineScorer } from "../plugin.ts";

export default defineScorer("predicted-ttft", {
  doc: "predicted TTFT in ms from an online per-worker fit (uncached tokens, backlog, engine queue and batch)",
  params: z.object({}).strict(),
  needs: ["promptTokens", "engineLoad"],
  create: (scope) => {
    const predictor = predictorOf(scope);
    return {
      name: "predicted-ttft",
      needs: ["promptTokens", "engineLoad"],
      score(ctx, at, weight, out) {
        const preds = predictor.predictions(ctx);
        let min = Number.POSITIVE_INFINITY;
        for (const i of at) if (preds[i] < min) min = preds[i];
        const unknown = Number.isFinite(min) ? min : 0;
        for (let k = 0; k < at.length; k++) {
          const p = preds[at[k]];
          out[k] = weight * (Number.isNaN(p) ? unknown : p);
        }
      },
      onRouted(_req, worker, ctx, route) {
        if (ctx) predictor.track(ctx, worker, route);
      },
      onWorkerRemoved(id) {
        predictor.forget(id);
      },
    };
  },
});
