/**
 * active-decode: requests running on the worker, `weight × max(in-flight here, engine running)`.
 * A decoding neighbour slows a prefill step far less than a block of prefill does (≈ 50 µs vs
 * 250 µs per step in vLLM-like timing), hence kv-aware's default weight 0.5.
 */
import { z } from "zod";
import { defineScorer } from "../plugin.ts";

export default defineScorer("active-decode", {
  doc: "requests running on the worker (max of in-flight here and the engine's running)",
  params: z.object({}).strict(),
  needs: ["engineLoad"],
  create: () => ({
    name: "active-decode",
    needs: ["engineLoad"],
    score(ctx, at, weight, out) {
      for (let k = 0; k < at.length; k++) {
        const c = ctx.all[at[k]];
        out[k] = weight * Math.max(c.inFlight, c.engineLoad?.running ?? 0);
      }
    },
  }),
});
