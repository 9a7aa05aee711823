// FROZEN copy of the pre-pipeline implementation (commit a5c2372), kept to prove the presets exact. Do not edit.
/**
 * kv-aware: ranks workers by prefix-cache locality against load (DESIGN.md "Router").
 *
 * For each candidate w (block size bs_w, prompt of P_w full blocks, O_w of them cached on w
 * according to the KvIndex built from the engines' KV events):
 *
 *   cost_w = overlapWeight  × (P_w − O_w)                    blocks this request must prefill
 *          + prefillWeight  × backlog_w / bs_w               the server's prefill backlog on w
 *          + decodeWeight   × active_w                       requests decoding on w
 *          + waitingWeight  × waiting_w                      the engine's queue (from /metrics)
 *          + pressureWeight × (P_w − O_w) × held_w / max held  new blocks on a fuller cache evict more
 *
 * backlog_w estimates the tokens still to prefill on w. The server's `pendingPrefillTokens` counts
 * whole prompts of requests not yet past their first token, but a backlog of prefix hits is quick
 * to clear and must not push the next hit elsewhere. So the policy keeps, per worker, the
 * (prompt, uncached) sizes of what it sent there in order, drops the oldest while their prompts
 * add up to more than `pendingPrefillTokens` (first tokens come roughly in order), and counts the
 * uncached tokens of the rest (plus any pending it cannot account for, in full).
 *
 * Temperature 0 picks the argmin (ties → the worker holding fewest blocks, then the smallest
 * id), so two server replicas fed the
 * same events pick the same worker; a temperature > 0 samples softmax(−normalised cost / T)
 * with a generator seeded by the request id. SGLang's imbalance guard comes first: when
 * max − min load > balanceAbsThreshold and max > min × balanceRelThreshold, the least-loaded
 * worker wins (hot-spotting on a shared system prompt). Workers without KV events get their
 * overlap from an approximate prefix tree of what this server routed (as approx-prefix).
 *
 * KV events trail routing by the prefill time: a burst of requests sharing a new document may
 * all see "cached nowhere" and scatter. With `recentRoutingMs` > 0, for that long after routing a
 * prompt this server also counts it as cached on the worker it chose (max of the two overlaps);
 * the events alone decide after that, so evictions are seen. Off by default (0): the choice then
 * depends on the events and loads only, so replicas fed the same events choose identically.
 *
 * Units are blocks of prefill. A decoding neighbour slows a prefill step far less than a block
 * of prefill does (≈ 50 µs vs 250 µs per step in vLLM-like timing), hence decodeWeight < 1; a
 * waiting request holds ours back by its whole prefill.
 *
 * held_w is the blocks the index says w holds: without the pressure term a new document whose
 * first block happens to be cached somewhere (a shared system line) lands there and evicts.
 *
 * LoRA: vLLM hashes a LoRA request's blocks with the adapter name first in their extra keys, and
 * a client names the adapter in `model` (vLLM serves `--lora-modules name=path` under `name`). A
 * request whose `model` the engines' events have named as a `lora_name` is hashed with it; the
 * index learns those names from the events, so an adapter never seen in events hashes as the
 * base model (it has no cached blocks anywhere yet either way).
 *
 * Data-parallel workers: the index keeps each DP rank's blocks apart and a worker's overlap is
 * its best rank's. For a vLLM worker whose record lists several ranks the selection pins that rank
 * (`Selection.dpRank`, sent as `X-data-parallel-rank`), since vLLM's own DP balancer does not look
 * at prefix caches; SGLang and ATOM workers are scored by their best rank without pinning.
 *
 * Options: overlapWeight (1), prefillWeight (1), decodeWeight (0.5), waitingWeight (4),
 * pressureWeight (0.1),
 * temperature (0), balanceAbsThreshold (16), balanceRelThreshold (1.5), chunkChars (64),
 * maxNodesPerWorker (100000), recentRoutingMs (0). Each decision is logged (debug) and counted
 * in `stats` and through the index's `decisionObserver` (the server's /metrics).
 */
import { ApproxPrefixTree } from "../../../../src/kv/approx-tree.ts";
import { hashString } from "../../../../src/kv/hash.ts";
import type { RoutingPolicy, RoutingRequest, Selection, WorkerState } from "../../../../src/router/types.ts";
import { isImbalanced, leastLoaded, numOption, requestLoad } from "./policy-util.ts";
import type { PolicyFactory } from "./types.ts";

export interface KvAwareWeights {
  overlapWeight: number;
  prefillWeight: number;
  decodeWeight: number;
  waitingWeight: number;
  pressureWeight: number;
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
    decodeWeight: numOption(o, "decodeWeight", 0.5),
    waitingWeight: numOption(o, "waitingWeight", 4),
    pressureWeight: numOption(o, "pressureWeight", 0.1),
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
  const index = ctx.kvIndex ?? null;
  const tree = new ApproxPrefixTree({
    chunkChars: numOption(ctx.options, "chunkChars", 64),
    maxNodesPerWorker: numOption(ctx.options, "maxNodesPerWorker", 100_000),
  });
  const recentMs = numOption(ctx.options, "recentRoutingMs", 0);
  const recent =
    recentMs > 0
      ? new ApproxPrefixTree({
          chunkChars: numOption(ctx.options, "chunkChars", 64),
          maxNodesPerWorker: 20_000,
          maxAgeMs: recentMs,
        })
      : null;
  const stats: KvAwareStats = { decisions: {}, overlapBlocks: 0, promptBlocks: 0 };
  /** Per worker, in routing order: prompt and uncached tokens of requests maybe still in prefill. */
  const ledgers = new Map<
    string,
    { prompt: number[]; uncached: number[]; sumPrompt: number; sumUncached: number }
  >();
  /** The last selection's sizes, handed to onRouted (select and onRouted run back to back). */
  let lastSel: { requestId: string; prompt: number; uncached: number } | null = null;

  function backlogOf(id: string, pending: number): number {
    const l = ledgers.get(id);
    if (!l) return pending;
    while (l.prompt.length > 0 && l.sumPrompt > pending) {
      l.sumPrompt -= l.prompt.shift()!;
      l.sumUncached -= l.uncached.shift()!;
    }
    return l.sumUncached + Math.max(0, pending - l.sumPrompt);
  }

  function blockSizeOf(c: WorkerState): number {
    return index?.blockSizeOf(c.record.id) ?? (c.record.blockSize > 0 ? c.record.blockSize : 16);
  }

  function evaluate(req: RoutingRequest, candidates: readonly WorkerState[]) {
    const n = candidates.length;
    const ids = candidates.map((c) => c.record.id);
    const tokens = req.promptTokens();
    const lora = index?.isLora(req.model) ? req.model : null;
    const ranks = new Int32Array(n);
    const overlaps: number[] = index
      ? Array.from(index.overlaps(tokens, ids, req.cacheSalt, lora, ranks))
      : new Array<number>(n).fill(-1);
    const promptBlocks = new Array<number>(n);
    const bs = new Array<number>(n);
    let approx: Int32Array | null = null;
    const text = recent || overlaps.includes(-1) ? req.promptText() : "";
    const fresh = recent ? recent.match(text, ids) : null;
    for (let i = 0; i < n; i++) {
      bs[i] = blockSizeOf(candidates[i]);
      promptBlocks[i] = Math.floor(tokens.length / bs[i]);
      const toBlocks = (chars: number) =>
        text.length > 0 ? Math.floor((promptBlocks[i] * Math.min(chars, text.length)) / text.length) : 0;
      if (overlaps[i] < 0) {
        // No KV events from this worker: estimate from what this server sent it.
        approx ??= tree.match(text, ids);
        overlaps[i] = toBlocks(approx[i]);
      }
      if (fresh && fresh[i] > 0) overlaps[i] = Math.max(overlaps[i], toBlocks(fresh[i]));
    }
    const costs = new Array<number>(n);
    const held = ids.map(heldBlocks);
    const maxHeld = Math.max(1, ...held);
    for (let i = 0; i < n; i++) {
      const c = candidates[i];
      const e = c.engineLoad;
      const active = Math.max(c.inFlight, e?.running ?? 0);
      const backlog = backlogOf(ids[i], c.pendingPrefillTokens);
      costs[i] =
        w.overlapWeight * (promptBlocks[i] - overlaps[i]) +
        (w.prefillWeight * backlog) / bs[i] +
        w.decodeWeight * active +
        w.waitingWeight * (e?.waiting ?? 0) +
        (w.pressureWeight * (promptBlocks[i] - overlaps[i]) * held[i]) / maxHeld;
    }
    return { ids, overlaps, costs, promptBlocks, ranks };
  }

  /** The rank to pin on a vLLM DP worker whose best rank holds part of the prompt. */
  function pinnedRank(c: WorkerState, overlap: number, rank: number): number | undefined {
    if (overlap <= 0 || rank < 0 || c.record.engine !== "vllm") return undefined;
    // Only a worker that fronts several ranks (its record lists them): a record per rank (vLLM
    // external load balancing) serves one rank, and a header naming another would be wrong.
    return (c.record.kvEvents?.ranks?.length ?? 0) > 1 ? rank : undefined;
  }

  /** Blocks a worker holds (events) or is believed to hold (fallback tree): its cache pressure. */
  function heldBlocks(id: string): number {
    return index?.hasWorker(id) ? index.blockCount(id) : tree.size(id);
  }

  function pick(req: RoutingRequest, ids: string[], costs: number[]): number {
    // Ties (typically a prefix cached nowhere, on idle workers) go to the emptiest cache, so new
    // prefixes spread out instead of evicting each other on one worker; then to the smallest id.
    let best = 0;
    let bestHeld = -1;
    for (let i = 1; i < costs.length; i++) {
      if (costs[i] > costs[best]) continue;
      if (costs[i] === costs[best]) {
        if (bestHeld < 0) bestHeld = heldBlocks(ids[best]);
        const held = heldBlocks(ids[i]);
        if (held > bestHeld || (held === bestHeld && ids[i] > ids[best])) continue;
        bestHeld = held;
      } else bestHeld = -1;
      best = i;
    }
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
    index?.decisionObserver?.(reason, overlap, blocks);
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
      const { ids, overlaps, costs, promptBlocks, ranks } = evaluate(req, candidates);
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
      const promptLen = req.promptTokens().length;
      lastSel = {
        requestId: req.requestId,
        prompt: promptLen,
        uncached: Math.max(0, promptLen - overlaps[i] * blockSizeOf(candidates[i])),
      };
      const dpRank = pinnedRank(candidates[i], overlaps[i], ranks[i]);
      ctx.logger.debug(
        {
          requestId: req.requestId,
          worker: ids[i],
          dpRank,
          reason,
          overlapBlocks: overlaps[i],
          promptBlocks: promptBlocks[i],
          cost: costs[i],
          candidates: ctx.logger.isLevelEnabled("trace")
            ? ids.map((id, k) => `${id}:${overlaps[k]}/${costs[k].toFixed(1)}`).join(" ")
            : undefined,
        },
        "kv-aware decision",
      );
      return dpRank === undefined
        ? { worker: candidates[i], overlapBlocks: overlaps[i], reason }
        : { worker: candidates[i], overlapBlocks: overlaps[i], reason, dpRank };
    },
    onRouted(req, worker) {
      const id = worker.record.id;
      const sel = lastSel?.requestId === req.requestId ? lastSel : null;
      const prompt = sel?.prompt ?? req.promptTokens().length;
      let l = ledgers.get(id);
      if (!l) {
        l = { prompt: [], uncached: [], sumPrompt: 0, sumUncached: 0 };
        ledgers.set(id, l);
      }
      l.prompt.push(prompt);
      l.uncached.push(sel?.uncached ?? prompt);
      l.sumPrompt += prompt;
      l.sumUncached += sel?.uncached ?? prompt;
      recent?.insert(req.promptText(), worker.record.id);
      // The long-lived fallback tree is only needed for workers that publish no KV events.
      if (!index?.hasWorker(worker.record.id)) tree.insert(req.promptText(), worker.record.id);
    },
    onWorkerRemoved(id) {
      tree.removeWorker(id);
      recent?.removeWorker(id);
      ledgers.delete(id);
    },
  };
  return policy;
};
