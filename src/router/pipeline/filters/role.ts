/** role: keeps the workers whose record has one of `roles` (mixed, prefill, decode). */
import { z } from "zod";
import { defineFilter } from "../plugin.ts";

export default defineFilter("role", {
  doc: "keeps workers of the given roles",
  params: z.object({ roles: z.array(z.enum(["mixed", "prefill", "decode"])).min(1) }).strict(),
  needs: [],
  create: (_scope, p) => ({
    name: "role",
    needs: [],
    filter: (ctx, at) => at.filter((i) => p.roles.includes(ctx.all[i].record.role)),
  }),
});
