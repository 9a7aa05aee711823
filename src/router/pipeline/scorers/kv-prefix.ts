/**
 * kv-prefix: blocks of the prompt a worker would have to prefill, `weight × (P − O)`, where P is
 * the prompt's full blocks at the worker's block size and O the leading blocks its cache holds
 * according to the KV index (the engines' KV events; a DP worker's best rank).
 *
 * It is also the step's overlap source (StepContext.overlaps), read by the imbalance guard's
 * tie-break, cache-pressure, prefill-backlog and the decision's reason:
 * - a worker the index does not track (no KV events) gets O from an approximate prefix tree of
 *   what this server routed to it (chunkChars, maxNodesPerWorker);
 * - with `recentRoutingMs` > 0, for that long after routing a prompt it also counts as cached on
 *   the chosen worker (the max of both), bridging the events' lag behind routing;
 * - with `bridgePending`, a routed prompt counts as cached on its worker while it waits for its
 *   prefill there, plus `bridgeGraceMs` (../pending-prefixes.ts): the same bridge, as long as
 *   the lag lasts rather than a fixed time; with peer replicas (`scope.peers`, src/router/peers)
 *   each routed prompt is announced to them and theirs count here the same way, for their TTL.
 * - LoRA: a request whose `model` the events named as an adapter is hashed with it (vLLM puts the
 *   adapter name first in a block's extra keys).
 * The trees are shared by every step of the model with the same params (one state per model).
 */
import { z } from "zod";
import { ApproxPrefixTree } from "../../../kv/approx-tree.ts";
import type { RoutingRequest, WorkerState } from "../../types.ts";
import { PendingPrefixes } from "../pending-prefixes.ts";
import { defineScorer } from "../plugin.ts";
import type { ModelScope, OverlapSource, StepContext } from "../types.ts";

const params = z
  .object({
    chunkChars: z.number().int().positive().default(64),
    maxNodesPerWorker: z.number().int().positive().default(100_000),
    recentRoutingMs: z.number().nonnegative().default(0),
    bridgePending: z.boolean().default(false),
    bridgeGraceMs: z.number().nonnegative().default(1000),
  })
  .strict();

function source(scope: ModelScope, p: z.output<typeof params>): OverlapSource {
  const key = `kv-prefix:${p.chunkChars}:${p.maxNodesPerWorker}:${p.recentRoutingMs}:${p.bridgePending}:${p.bridgeGraceMs}`;
  return scope.shared(key, () => {
    const index = scope.kvIndex;
    const tree = new ApproxPrefixTree({ chunkChars: p.chunkChars, maxNodesPerWorker: p.maxNodesPerWorker });
    const recent =
      p.recentRoutingMs > 0
        ? new ApproxPrefixTree({
            chunkChars: p.chunkChars,
            maxNodesPerWorker: 20_000,
            maxAgeMs: p.recentRoutingMs,
          })
        : null;
    const pending = p.bridgePending ? new PendingPrefixes(p.bridgeGraceMs) : null;
    const src: OverlapSource = {
      overlaps(ctx: StepContext) {
        const { req, all } = ctx;
        const n = all.length;
        const ids = all.map((c) => c.record.id);
        const tokens = req.promptTokens();
        const lora = index?.isLora(req.model) ? req.model : null;
        const ranks = new Int32Array(n);
        const overlaps = index
          ? index.overlaps(tokens, ids, req.cacheSalt, lora, ranks)
          : new Int32Array(n).fill(-1);
        let missing = false;
        for (let i = 0; i < n; i++) if (overlaps[i] < 0) missing = true;
        const text = recent || pending || missing ? req.promptText() : "";
        const fresh = recent ? recent.match(text, ids) : null;
        const path = pending ? tree.path(text) : null;
        let approx: Int32Array | null = null;
        for (let i = 0; i < n; i++) {
          const blocks = ctx.promptBlocks(i);
          const toBlocks = (chars: number) =>
            text.length > 0 ? Math.floor((blocks * Math.min(chars, text.length)) / text.length) : 0;
          if (overlaps[i] < 0) {
            // No KV events from this worker: estimate from what this server sent it.
            approx ??= tree.match(text, ids);
            overlaps[i] = toBlocks(approx[i]);
          }
          if (fresh && fresh[i] > 0) overlaps[i] = Math.max(overlaps[i], toBlocks(fresh[i]));
          if (pending && path) {
            const local = pending.match(ids[i], path, all[i].pendingPrefillTokens);
            const nodes = Math.max(local, scope.peers?.match(ids[i], path) ?? 0); // peer replicas' (src/router/peers)
            if (nodes > 0) overlaps[i] = Math.max(overlaps[i], toBlocks(nodes * p.chunkChars));
          }
        }
        return { overlaps, ranks };
      },
      held: (id) => (index?.hasWorker(id) ? index.blockCount(id) : tree.size(id)),
      onRouted(req: RoutingRequest, worker: WorkerState) {
        recent?.insert(req.promptText(), worker.record.id);
        if (pending) {
          const path = tree.path(req.promptText());
          pending.add(worker.record.id, path, req.promptTokens().length);
          scope.peers?.announce(worker.record.id, path, req.promptTokens().length); // peer replicas
        }
        // The long-lived fallback tree is only needed for workers that publish no KV events.
        if (!index?.hasWorker(worker.record.id)) tree.insert(req.promptText(), worker.record.id);
      },
      onWorkerRemoved(id) {
        tree.removeWorker(id);
        recent?.removeWorker(id);
        pending?.removeWorker(id);
      },
    };
    return src;
  });
}

export default defineScorer("kv-prefix", {
  doc: "uncached prompt blocks on the worker (KV index; approximate tree for workers without events)",
  params,
  needs: ["kvIndex", "promptTokens", "approxTree"],
  create: (scope, p) => {
    const overlapSource = source(scope, p);
    return {
      name: "kv-prefix",
      needs: ["kvIndex", "promptTokens", "approxTree"],
      overlapSource,
      score(ctx, at, weight, out) {
        const o = ctx.overlaps();
        for (let k = 0; k < at.length; k++) out[k] = weight * (ctx.promptBlocks(at[k]) - o[at[k]]);
      },
    };
  },
});
