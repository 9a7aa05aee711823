// FROZEN copy of the pre-pipeline implementation (commit a5c2372), kept to prove the presets exact. Do not edit.
/**
 * approx-prefix: sgl-router's cache-aware policy over an approximate prefix tree of what this
 * server routed where (src/kv/approx-tree.ts). No KV events needed; each server replica learns
 * only from its own traffic.
 *
 * - Imbalanced fleet (SGLang rule, see isImbalanced) → the least-loaded worker.
 * - Else the best text-prefix match, when it covers more than `cacheThreshold` of the prompt.
 * - Else the worker with the smallest tree (most cache room), so new prefixes spread out.
 *
 * Options: cacheThreshold (0.5), balanceAbsThreshold (16), balanceRelThreshold (1.5),
 * chunkChars (64), maxNodesPerWorker (100000).
 */
import { ApproxPrefixTree } from "../../../../src/kv/approx-tree.ts";
import type { RoutingPolicy, Selection } from "../../../../src/router/types.ts";
import { isImbalanced, leastLoaded, numOption, requestLoad } from "./policy-util.ts";
import type { PolicyFactory } from "./types.ts";

export const createApproxPrefix: PolicyFactory = (ctx) => {
  const o = ctx.options;
  const cacheThreshold = numOption(o, "cacheThreshold", 0.5);
  const absT = numOption(o, "balanceAbsThreshold", 16);
  const relT = numOption(o, "balanceRelThreshold", 1.5);
  const tree = new ApproxPrefixTree({
    chunkChars: numOption(o, "chunkChars", 64),
    maxNodesPerWorker: numOption(o, "maxNodesPerWorker", 100_000),
  });
  const policy: RoutingPolicy & { tree: ApproxPrefixTree } = {
    name: "approx-prefix",
    tree,
    select(req, candidates): Selection {
      const loads = candidates.map(requestLoad);
      if (isImbalanced(loads, absT, relT)) {
        const i = leastLoaded(candidates, loads);
        ctx.logger.debug(
          { requestId: req.requestId, worker: candidates[i].record.id },
          "approx: load-balance",
        );
        return { worker: candidates[i], reason: "load-balance" };
      }
      const text = req.promptText();
      const ids = candidates.map((c) => c.record.id);
      const matched = tree.match(text, ids);
      let best = 0;
      for (let i = 1; i < candidates.length; i++) {
        const d = matched[i] - matched[best];
        if (
          d > 0 ||
          (d === 0 && (loads[i] < loads[best] || (loads[i] === loads[best] && ids[i] < ids[best])))
        )
          best = i;
      }
      const rate = text.length > 0 ? matched[best] / text.length : 0;
      if (rate > cacheThreshold) {
        ctx.logger.debug({ requestId: req.requestId, worker: ids[best], rate }, "approx: prefix match");
        return { worker: candidates[best], reason: "prefix-match" };
      }
      const sizes = ids.map((id) => tree.size(id));
      const i = leastLoaded(
        candidates,
        sizes,
        loads.map((l) => -l),
      );
      ctx.logger.debug({ requestId: req.requestId, worker: ids[i], rate }, "approx: least cache");
      return { worker: candidates[i], reason: "least-cache" };
    },
    onRouted(req, worker) {
      tree.insert(req.promptText(), worker.record.id);
    },
    onWorkerRemoved(id) {
      tree.removeWorker(id);
    },
  };
  return policy;
};
