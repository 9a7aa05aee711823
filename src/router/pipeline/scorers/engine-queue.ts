/** engine-queue: the engine's own waiting queue (PD backlog included), `weight × waiting`. */
import { z } from "zod";
import { defineScorer } from "../plugin.ts";

export default defineScorer("engine-queue", {
  doc: "requests waiting in the engine's queue (from its /metrics)",
  params: z.object({}).strict(),
  needs: ["engineLoad"],
  create: () => ({
    name: "engine-queue",
    needs: ["engineLoad"],
    score(ctx, at, weight, out) {
      for (let k = 0; k < at.length; k++) out[k] = weight * (ctx.all[at[k]].engineLoad?.waiting ?? 0);
    },
  }),
});
