/** health: keeps the workers the circuit breaker has in rotation (`available`). */
import { z } from "zod";
import { defineFilter } from "../plugin.ts";

export default defineFilter("health", {
  doc: "keeps workers whose circuit breaker is closed (available)",
  params: z.object({}).strict(),
  needs: [],
  create: () => ({
    name: "health",
    needs: [],
    filter: (ctx, at) => at.filter((i) => ctx.all[i].available),
  }),
});
