/**
 * lora-affinity: keeps a LoRA adapter on the workers that already run it. vLLM holds at most
 * `--max-loras` adapters in GPU slots and swaps one in on demand; sending an adapter's requests
 * to a worker that was sent it recently avoids the swap. A request is an adapter request when
 * its `model` is not the worker's base model (vLLM serves `--lora-modules name=path` under
 * `name`). Value: `weight × (0 if the worker was among the last `maxAdaptersPerWorker` adapters
 * routed to it, else 1)`; 0 for base-model requests.
 */
import { z } from "zod";
import { defineScorer } from "../plugin.ts";

export default defineScorer("lora-affinity", {
  doc: "0 when the worker recently ran the request's LoRA adapter, else 1",
  params: z.object({ maxAdaptersPerWorker: z.number().int().positive().default(4) }).strict(),
  needs: [],
  create: (scope, p) => {
    /** worker → adapters routed to it, least recent first. */
    const loaded = scope.shared("lora-affinity", () => new Map<string, string[]>());
    return {
      name: "lora-affinity",
      needs: [],
      score(ctx, at, weight, out) {
        const model = ctx.req.model;
        for (let k = 0; k < at.length; k++) {
          const w = ctx.all[at[k]];
          const adapter = model !== w.record.model;
          out[k] = adapter && !loaded.get(w.record.id)?.includes(model) ? weight : 0;
        }
      },
      onRouted(req, worker) {
        if (req.model === worker.record.model) return;
        const list = loaded.get(worker.record.id) ?? [];
        const at = list.indexOf(req.model);
        if (at >= 0) list.splice(at, 1);
        list.push(req.model);
        if (list.length > p.maxAdaptersPerWorker) list.shift();
        loaded.set(worker.record.id, list);
      },
      onWorkerRemoved(id) {
        loaded.delete(id);
      },
    };
  },
});
