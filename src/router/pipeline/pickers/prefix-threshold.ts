/**
 * prefix-threshold: sgl-router's cache-aware rule over the approx-prefix scorer (weight 1,
 * whose totals are −matched characters).
 * - The best match (lowest total; ties → lower load, then smaller id) wins when it covers more
 *   than `cacheThreshold` of the templated prompt: reason "prefix-match".
 * - Else the worker with the smallest cache (held: the tree's size; ties → lower load, then
 *   smaller id), so new prefixes spread out: reason "least-cache".
 */
import { z } from "zod";
import { definePicker } from "../plugin.ts";
import { leastLoadedIndex } from "../util.ts";

export default definePicker("prefix-threshold", {
  doc: "best approximate prefix match above cacheThreshold, else the emptiest cache",
  params: z.object({ cacheThreshold: z.number().default(0.5) }).strict(),
  needs: ["approxTree"],
  create: (_scope, p) => ({
    name: "prefix-threshold",
    needs: ["approxTree"],
    pick(ctx, at, totals) {
      const all = ctx.loads();
      const ids = at.map((i) => ctx.all[i].record.id);
      let best = 0;
      for (let i = 1; i < at.length; i++) {
        const d = totals[best] - totals[i];
        const li = all[at[i]];
        const lb = all[at[best]];
        if (d > 0 || (d === 0 && (li < lb || (li === lb && ids[i] < ids[best])))) best = i;
      }
      const text = ctx.req.promptText();
      const rate = text.length > 0 ? -totals[best] / text.length : 0;
      if (rate > p.cacheThreshold) {
        ctx.reason = "prefix-match";
        return best;
      }
      ctx.reason = "least-cache";
      const sizes = at.map((i) => ctx.held(i));
      return leastLoadedIndex(
        ids,
        sizes,
        at.map((i) => -all[i]),
      );
    },
  }),
});
