/**
 * kv-aware: ranks workers by prefix-cache locality against load (DESIGN.md "Router").
 *
 * For each candidate w (block size bs_w, prompt of P_w full blocks, O_w of them cached on w
 * according to the KvIndex built from the engines' KV events):
 *
 *   cost_w = overlapWeight  × (P_w − O_w)                    blocks this request must prefill
 *          + prefillWeight  × pendingPrefillTokens_w / bs_w  the server's prefill backlog on w
 *          + decodeWeight   × active_w                       requests decoding on w
 *          + waitingWeight  × waiting_w                      the engine's queue (from /metrics)
 *
 * Temperature 0 picks the argmin (ties → smallest worker id), so two server replicas fed the
 * same events pick the same worker; a temperature > 0 samples softmax(−normalised cost / T)
 * with a generator seeded by the request id. SGLang's imbalance guard comes first: when
 * max − min load > balanceAbsThreshold and max > min × balanceRelThreshold, the least-loaded
 * worker wins (hot-spotting on a shared system prompt). Workers without KV events get their
 * overlap from an approximate prefix tree of what this server routed (as approx-prefix).
 *
 * Options: overlapWeight (1), prefillWeight (1), decodeWeight (2), waitingWeight (4),
 * temperature (0), balanceAbsThreshold (16), balanceRelThreshold (1.5), chunkChars (64),
 * maxNodesPerWorker (100000), metricsRegistry (a prom-client Registry).
 */
import { Counter, Histogram, Registry } from "prom-client";
import { ApproxPrefixTree } from "../../kv/approx-tree.ts";
import { hashString } from "../../kv/hash.ts";
import { KvIndex } from "../../kv/index.ts";
import { isImbalanced, leastLoaded, numOption, requestLoad } from "../../kv/policy-util.ts";
import type { PolicyFactory, RoutingPolicy, RoutingRequest, Selection, WorkerState } from "../types.ts";

export interface KvAwareWeights {
  overlapWeight: number;
  prefillWeight: number;
  decodeWeight: number;
  waitingWeight: number;
  temperature: number;
  balanceAbsThreshold: number;
  balanceRelThreshold: number;
}

export interface KvAwareStats {
  decisions: Record<string, number>;
  /** Sum of the chosen workers' cached blocks, and of the prompts' blocks. */
  overlapBlocks: number;
  promptBlocks: number;
}

export interface KvAwarePolicy extends RoutingPolicy {
  readonly weights: KvAwareWeights;
  readonly stats: KvAwareStats;
  /** Per-candidate overlap (blocks) and cost, as the last select() computed them (for logs/tests). */
  explain(req: RoutingRequest, candidates: readonly WorkerState[]): { overlaps: number[]; costs: number[] };
}

function readWeights(o: Readonly<Record<string, unknown>>): KvAwareWeights {
  return {
    overlapWeight: numOption(o, "overlapWeight", 1),
    prefillWeight: numOption(o, "prefillWeight", 1),
    decodeWeight: numOption(o, "decodeWeight", 2),
    waitingWeight: numOption(o, "waitingWeight", 4),
    temperature: numOption(o, "temperature", 0),
    balanceAbsThreshold: numOption(o, "balanceAbsThreshold", 16),
    balanceRelThreshold: numOption(o, "balanceRelThreshold", 1.5),
  };
}

/** A deterministic [0, 1) draw from the request id (same request → same draw on every replica). */
function drawFor(requestId: string): number {
  return hashString(requestId, 0x2545f491) / 4294967296;
}

export const createKvAware: PolicyFactory = (ctx) => {
  const w = readWeights(ctx.options);
  const index = ctx.kvIndex instanceof KvIndex ? ctx.kvIndex : null;
  const tree = new ApproxPrefixTree({
    chunkChars: numOption(ctx.options, "chunkChars", 64),
    maxNodesPerWorker: numOption(ctx.options, "maxNodesPerWorker", 100_000),
  });
  const reg = ctx.options.metricsRegistry instanceof Registry ? ctx.options.metricsRegistry : null;
  const decisionsCounter = reg
    ? new Counter({
        name: "infera_kv_routing_decisions_total",
        help: "kv-aware routing decisions by reason",
        labelNames: ["reason"],
        registers: [reg],
      })
    : null;
  const overlapHist = reg
    ? new Histogram({
        name: "infera_kv_routing_overlap_ratio",
        help: "Cached fraction of the prompt on the worker kv-aware chose",
        buckets: [0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1],
        registers: [reg],
      })
    : null;
  const stats: KvAwareStats = { decisions: {}, overlapBlocks: 0, promptBlocks: 0 };

  function blockSizeOf(c: WorkerState): number {
    return index?.blockSizeOf(c.record.id) ?? (c.record.blockSize > 0 ? c.record.blockSize : 16);
  }

  function evaluate(req: RoutingRequest, candidates: readonly WorkerState[]) {
    const n = candidates.length;
    const ids = candidates.map((c) => c.record.id);
    const tokens = req.promptTokens();
    const overlaps: number[] = index
      ? Array.from(index.overlaps(tokens, ids, req.cacheSalt))
      : new Array<number>(n).fill(-1);
    const promptBlocks = new Array<number>(n);
    const bs = new Array<number>(n);
    let approx: Int32Array | null = null;
    for (let i = 0; i < n; i++) {
      bs[i] = blockSizeOf(candidates[i]);
      promptBlocks[i] = Math.floor(tokens.length / bs[i]);
      if (overlaps[i] < 0) {
        // No KV events from this worker: estimate from what this server sent it.
        const text = req.promptText();
        approx ??= tree.match(text, ids);
        overlaps[i] = text.length > 0 ? Math.floor((promptBlocks[i] * approx[i]) / text.length) : 0;
      }
    }
    const costs = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const c = candidates[i];
      const e = c.engineLoad;
      const active = Math.max(c.inFlight, e?.running ?? 0);
      costs[i] =
        w.overlapWeight * (promptBlocks[i] - overlaps[i]) +
        (w.prefillWeight * c.pendingPrefillTokens) / bs[i] +
        w.decodeWeight * active +
        w.waitingWeight * (e?.waiting ?? 0);
    }
    return { ids, overlaps, costs, promptBlocks };
  }

  function pick(req: RoutingRequest, ids: string[], costs: number[]): number {
    let best = 0;
    for (let i = 1; i < costs.length; i++)
      if (costs[i] < costs[best] || (costs[i] === costs[best] && ids[i] < ids[best])) best = i;
    if (w.temperature <= 0 || costs.length < 2) return best;
    // Softmax over costs normalised to [0, 1], in id order so every replica samples alike.
    let min = Number.POSITIVE_INFINITY;
    let max = Number.NEGATIVE_INFINITY;
    for (const c of costs) {
      min = Math.min(min, c);
      max = Math.max(max, c);
    }
    const span = max - min || 1;
    const order = ids.map((_, i) => i).sort((a, b) => (ids[a] < ids[b] ? -1 : ids[a] > ids[b] ? 1 : 0));
    const weights = order.map((i) => Math.exp(-(costs[i] - min) / span / w.temperature));
    const total = weights.reduce((a, b) => a + b, 0);
    let r = drawFor(req.requestId) * total;
    for (let k = 0; k < order.length; k++) {
      r -= weights[k];
      if (r < 0) return order[k];
    }
    return order[order.length - 1];
  }

  function record(reason: string, overlap: number, blocks: number): void {
    stats.decisions[reason] = (stats.decisions[reason] ?? 0) + 1;
    stats.overlapBlocks += overlap;
    stats.promptBlocks += blocks;
    decisionsCounter?.inc({ reason });
    overlapHist?.observe(blocks > 0 ? overlap / blocks : 0);
  }

  const policy: KvAwarePolicy = {
    name: "kv-aware",
    weights: w,
    stats,
    explain(req, candidates) {
      const { overlaps, costs } = evaluate(req, candidates);
      return { overlaps, costs };
    },
    select(req, candidates): Selection {
      const { ids, overlaps, costs, promptBlocks } = evaluate(req, candidates);
      const loads = candidates.map(requestLoad);
      let i: number;
      let reason: string;
      if (isImbalanced(loads, w.balanceAbsThreshold, w.balanceRelThreshold)) {
        i = leastLoaded(candidates, loads, overlaps);
        reason = "load-balance";
      } else {
        i = pick(req, ids, costs);
        reason = overlaps[i] > 0 ? "overlap" : "load";
      }
      record(reason, overlaps[i], promptBlocks[i]);
      ctx.logger.debug(
        {
          requestId: req.requestId,
          worker: ids[i],
          reason,
          overlapBlocks: overlaps[i],
          promptBlocks: promptBlocks[i],
          cost: costs[i],
        },
        "kv-aware decision",
      );
      return { worker: candidates[i], overlapBlocks: overlaps[i], reason };
    },
    onRouted(req, worker) {
      // The fallback tree is only needed for workers that publish no KV events.
      if (!index?.hasWorker(worker.record.id)) tree.insert(req.promptText(), worker.record.id);
    },
    onWorkerRemoved(id) {
      tree.removeWorker(id);
    },
  };
  return policy;
};
