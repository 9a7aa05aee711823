/**
 * imbalance-guard: SGLang's rule. When max − min request load over the candidates exceeds
 * `balanceAbsThreshold` AND max > min × `balanceRelThreshold`, load wins over cache locality:
 * the guard narrows the step to the least-loaded candidate (ties → the larger prefix overlap
 * with `prefer: overlap`, then the smaller id) and the decision's reason is "load-balance".
 * Otherwise it keeps every candidate. Load = max(in-flight here, engine running + waiting).
 */
import { z } from "zod";
import { defineFilter } from "../plugin.ts";
import { isImbalanced, leastLoadedIndex } from "../util.ts";

export default defineFilter("imbalance-guard", {
  doc: "narrows to the least-loaded worker when the fleet is imbalanced (SGLang's rule)",
  params: z
    .object({
      balanceAbsThreshold: z.number().default(16),
      balanceRelThreshold: z.number().default(1.5),
      prefer: z.enum(["overlap", "none"]).default("overlap"),
    })
    .strict(),
  needs: ["engineLoad"],
  create: (_scope, p) => ({
    name: "imbalance-guard",
    needs: ["engineLoad"],
    filter(ctx, at) {
      const all = ctx.loads();
      const loads = at.length === all.length ? all : Float64Array.from(at, (i) => all[i]);
      if (!isImbalanced(loads, p.balanceAbsThreshold, p.balanceRelThreshold)) return at;
      const ids = at.map((i) => ctx.all[i].record.id);
      let prefer: Int32Array | undefined;
      if (p.prefer === "overlap") {
        const o = ctx.overlaps();
        prefer = at.length === o.length ? o : Int32Array.from(at, (i) => o[i]);
      }
      ctx.reason = "load-balance";
      return [at[leastLoadedIndex(ids, loads, prefer)]];
    },
  }),
});
