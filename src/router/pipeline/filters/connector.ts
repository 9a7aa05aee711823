/**
 * connector: keeps the workers whose KV connector is one of `kinds` (e.g. only `nixl` prefill
 * workers). The PD pairing rule itself (a prefill worker needs a decode partner speaking its
 * connector) stays in disagg/select.ts, which hands the step only paired candidates.
 */
import { z } from "zod";
import { defineFilter } from "../plugin.ts";

export default defineFilter("connector", {
  doc: "keeps workers whose KV connector is one of the given kinds",
  params: z.object({ kinds: z.array(z.string().min(1)).min(1) }).strict(),
  needs: [],
  create: (_scope, p) => ({
    name: "connector",
    needs: [],
    filter: (ctx, at) => at.filter((i) => p.kinds.includes(ctx.all[i].record.connector.kind)),
  }),
});
