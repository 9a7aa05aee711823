/**
 * cache-pressure: new blocks on a fuller cache evict more,
 * `(weight × (P − O) × held) / max(1, max held over the scored candidates)`, with held the
 * blocks the worker holds (KV index, else the overlap source's estimate). Without it a new
 * document whose first block happens to be cached somewhere (a shared system line) lands there
 * and evicts.
 */
import { z } from "zod";
import { defineScorer } from "../plugin.ts";

export default defineScorer("cache-pressure", {
  doc: "uncached blocks weighted by how full the worker's cache is relative to the fullest",
  params: z.object({}).strict(),
  needs: ["kvIndex", "promptTokens"],
  create: () => ({
    name: "cache-pressure",
    needs: ["kvIndex", "promptTokens"],
    score(ctx, at, weight, out) {
      const o = ctx.overlaps();
      // A loop, not `Math.max(1, ...held)`: no array and no 256-argument call per decision.
      let maxHeld = 1;
      for (let k = 0; k < at.length; k++) maxHeld = Math.max(maxHeld, ctx.held(at[k]));
      for (let k = 0; k < at.length; k++)
        out[k] = (weight * (ctx.promptBlocks(at[k]) - o[at[k]]) * ctx.held(at[k])) / maxHeld;
    },
  }),
});
