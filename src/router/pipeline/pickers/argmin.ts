/**
 * argmin: the lowest total wins. Ties (typically a prefix cached nowhere, on idle workers) go to
 * the worker holding the fewest blocks, so new prefixes spread out instead of evicting each
 * other on one worker, then to the smallest id: two server replicas fed the same events choose
 * the same worker. With `temperature` > 0 it samples softmax(−normalised total / T) in id order
 * with a draw seeded by the request id (the same request draws alike on every replica).
 */
import { z } from "zod";
import { hashString } from "../../../kv/hash.ts";
import { definePicker } from "../plugin.ts";

/** A deterministic [0, 1) draw from the request id. */
export function drawFor(requestId: string): number {
  return hashString(requestId, 0x2545f491) / 4294967296;
}

export default definePicker("argmin", {
  doc: "lowest total; ties → fewest held blocks, then smallest id; softmax when temperature > 0",
  params: z.object({ temperature: z.number().nonnegative().default(0) }).strict(),
  needs: [],
  create: (_scope, p) => ({
    name: "argmin",
    needs: [],
    pick(ctx, at, costs) {
      const all = ctx.all;
      let best = 0;
      let bestHeld = -1;
      for (let i = 1; i < costs.length; i++) {
        if (costs[i] > costs[best]) continue;
        if (costs[i] === costs[best]) {
          if (bestHeld < 0) bestHeld = ctx.held(at[best]);
          const held = ctx.held(at[i]);
          if (held > bestHeld || (held === bestHeld && all[at[i]].record.id > all[at[best]].record.id))
            continue;
          bestHeld = held;
        } else bestHeld = -1;
        best = i;
      }
      if (p.temperature <= 0 || costs.length < 2) return best;
      // Softmax over totals normalised to [0, 1], in id order so every replica samples alike.
      let min = Number.POSITIVE_INFINITY;
      let max = Number.NEGATIVE_INFINITY;
      for (const c of costs) {
        min = Math.min(min, c);
        max = Math.max(max, c);
      }
      const span = max - min || 1;
      const ids = at.map((i) => all[i].record.id);
      const order = ids.map((_, i) => i).sort((a, b) => (ids[a] < ids[b] ? -1 : ids[a] > ids[b] ? 1 : 0));
      const weights = order.map((i) => Math.exp(-(costs[i] - min) / span / p.temperature));
      const total = weights.reduce((a, b) => a + b, 0);
      let r = drawFor(ctx.req.requestId) * total;
      for (let k = 0; k < order.length; k++) {
        r -= weights[k];
        if (r < 0) return order[k];
      }
      return order[order.length - 1];
    },
  }),
});
