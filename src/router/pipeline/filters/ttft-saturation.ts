/**
 * ttft-saturation: drops the candidates whose predicted TTFT for this request exceeds its
 * target (src/router/predict/target.ts: the `x-infera-ttft-target-ms` header, else `byModel` /
 * `byPriority` / `targetMs`), unless all do (the pipeline ignores a filter that would leave
 * nobody; the router queue, when one is configured, holds such a request instead). No target,
 * or no prediction for a candidate: kept. It teaches the predictor as `predicted-ttft` does
 * (once per request when both are in a profile).
 */
import { z } from "zod";
import { type TtftTargetConfig, ttftTargetOf, ttftTargetParams } from "../../predict/target.ts";
import { predictorOf } from "../../predict/ttft.ts";
import { defineFilter } from "../plugin.ts";

export default defineFilter("ttft-saturation", {
  doc: "drops candidates whose predicted TTFT exceeds the request's target (header x-infera-ttft-target-ms or params), unless all do",
  params: z.object(ttftTargetParams).strict(),
  needs: ["promptTokens", "engineLoad"],
  create: (scope, p) => {
    const predictor = predictorOf(scope);
    const cfg: TtftTargetConfig = p;
    return {
      name: "ttft-saturation",
      needs: ["promptTokens", "engineLoad"],
      filter(ctx, at) {
        const target = ttftTargetOf(ctx.req, cfg);
        if (target === undefined) return at;
        const preds = predictor.predictions(ctx);
        let over = 0;
        for (const i of at) if (preds[i] > target) over++;
        if (over === 0) return at;
        return at.filter((i) => !(preds[i] > target));
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
