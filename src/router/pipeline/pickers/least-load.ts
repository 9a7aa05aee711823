/**
 * least-load: the decode choice PD routers make (llm-d's and Dynamo's default for D): fewest
 * requests in flight from this server, then the engine's running + waiting, then KV cache usage;
 * the first candidate wins a full tie. Totals are ignored.
 */
import { z } from "zod";
import { definePicker } from "../plugin.ts";
import { decodeLoadKey } from "../util.ts";

export default definePicker("least-load", {
  doc: "fewest in flight, then engine running + waiting, then KV usage (totals ignored)",
  params: z.object({}).strict(),
  needs: ["engineLoad"],
  create: () => ({
    name: "least-load",
    needs: ["engineLoad"],
    pick(ctx, at) {
      let best = 0;
      let bk = decodeLoadKey(ctx.all[at[0]]);
      for (let i = 1; i < at.length; i++) {
        const k = decodeLoadKey(ctx.all[at[i]]);
        if (k[0] < bk[0] || (k[0] === bk[0] && (k[1] < bk[1] || (k[1] === bk[1] && k[2] < bk[2])))) {
          best = i;
          bk = k;
        }
      }
      ctx.reason = "least-load";
      return best;
    },
  }),
});
