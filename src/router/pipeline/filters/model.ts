/** model: keeps the workers that serve the requested model name (or one of its LoRA adapters). */
import { z } from "zod";
import { defineFilter } from "../plugin.ts";

export default defineFilter("model", {
  doc: "keeps workers serving the request's model name",
  params: z.object({}).strict(),
  needs: [],
  create: () => ({
    name: "model",
    needs: [],
    filter: (ctx, at) => at.filter((i) => ctx.all[i].record.servedModelNames.includes(ctx.req.model)),
  }),
});
