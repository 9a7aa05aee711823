/**
 * load-ceiling: keeps only the candidates whose request load is at most `ratio` × the
 * candidates' mean load + `slack`. SGLang's rule (imbalance-guard) sends every request to the
 * least-loaded worker once the fleet is imbalanced, so one hot tenant costs every other tenant
 * its locality; this filter instead takes only the overloaded workers out of the choice. A hot
 * tenant's traffic spills to the next-best worker by the scorers (which then caches that prefix
 * too), while a request whose best worker is under the ceiling keeps it. Load = max(in-flight
 * here, engine running + waiting), as for the guard.
 */
import { z } from "zod";
import { defineFilter } from "../plugin.ts";

export default defineFilter("load-ceiling", {
  doc: "drops candidates loaded above ratio × the mean load + slack (a hot worker sheds, the rest keep locality)",
  params: z
    .object({
      ratio: z.number().min(1).default(1.5),
      slack: z.number().min(0).default(1),
    })
    .strict(),
  needs: ["engineLoad"],
  create: (_scope, p) => ({
    name: "load-ceiling",
    needs: ["engineLoad"],
    filter(ctx, at) {
      if (at.length < 2) return at;
      const loads = ctx.loads();
      let sum = 0;
      let max = Number.NEGATIVE_INFINITY;
      for (let k = 0; k < at.length; k++) {
        const l = loads[at[k]];
        sum += l;
        if (l > max) max = l;
      }
      const ceiling = (sum / at.length) * p.ratio + p.slack;
      // Nobody above the ceiling (the usual case): the list as it is, one pass.
      if (max <= ceiling) return at;
      return at.filter((i) => loads[i] <= ceiling);
    },
  }),
});
