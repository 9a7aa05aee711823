/**
 * approx-prefix: sgl-router's cache-aware view without KV events. An approximate prefix tree of
 * the templated prompts this server routed where (src/kv/approx-tree.ts, chunks of
 * `chunkChars`, `maxNodesPerWorker` per worker in LRU order) gives the characters of the prompt
 * each worker has seen: the value is `weight × −matched` (a match lowers the cost). It is also
 * the step's cache view (held = the worker's tree size) when no kv-prefix scorer is present.
 * The tree is per model, shared by every step with the same params.
 */
import { z } from "zod";
import { ApproxPrefixTree } from "../../../kv/approx-tree.ts";
import { defineScorer } from "../plugin.ts";

export default defineScorer("approx-prefix", {
  doc: "minus the prompt characters this server already sent to the worker (approximate tree)",
  params: z
    .object({
      chunkChars: z.number().int().positive().default(64),
      maxNodesPerWorker: z.number().int().positive().default(100_000),
    })
    .strict(),
  needs: ["approxTree"],
  create: (scope, p) => {
    const tree = scope.shared(
      `approx-prefix:${p.chunkChars}:${p.maxNodesPerWorker}`,
      () => new ApproxPrefixTree({ chunkChars: p.chunkChars, maxNodesPerWorker: p.maxNodesPerWorker }),
    );
    return {
      name: "approx-prefix",
      needs: ["approxTree"],
      cacheView: { held: (id: string) => tree.size(id) },
      score(ctx, at, weight, out) {
        const ids = at.map((i) => ctx.all[i].record.id);
        const matched = tree.match(ctx.req.promptText(), ids);
        for (let k = 0; k < at.length; k++) out[k] = weight * -matched[k];
      },
      onRouted(req, worker) {
        tree.insert(req.promptText(), worker.record.id);
      },
      onWorkerRemoved(id) {
        tree.removeWorker(id);
      },
    };
  },
});
