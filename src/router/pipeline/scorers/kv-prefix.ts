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
 * - with `bridgePending` (on in the `kv-aware` preset), a routed prompt counts as cached on its
 *   worker from routing until the engine's KV events confirm its blocks there, or its request
 *   fails or is cancelled before its prefill is done, or `bridgeGraceMs` after that prefill
 *   without confirmation, or `bridgeTtlMs` at most (../pending-prefixes.ts): the same bridge, as
 *   long as the lag lasts rather than a fixed time. The router's dispatch claim drives it.
 *   With peer replicas (`scope.peers`, src/router/peers) each routed prompt is announced to
 *   them and theirs count here the same way, until the sender retracts it (its own entry ended)
 *   or their TTL.
 * - LoRA: a request whose `model` the events named as an adapter is hashed with it (vLLM puts the
 *   adapter name first in a block's extra keys).
 * The trees are shared by every step of the model with the same params (one state per model).
 */
import { z } from "zod";
import { ApproxPrefixTree, BRIDGE_TEXT_CAP } from "../../../kv/approx-tree.ts";
import type { PrefixIndex } from "../../../kv/prefix-index.ts";
import type { RouteLifecycle, RoutingRequest, WorkerState } from "../../types.ts";
import { type BridgeProbe, PendingPrefixes } from "../pending-prefixes.ts";
import { defineScorer } from "../plugin.ts";
import type { ModelScope, OverlapResult, OverlapSource, StepContext } from "../types.ts";
import { candidateView } from "../util.ts";

const params = z
  .object({
    chunkChars: z.number().int().positive().default(64),
    maxNodesPerWorker: z.number().int().positive().default(100_000),
    recentRoutingMs: z.number().nonnegative().default(0),
    bridgePending: z.boolean().default(false),
    bridgeGraceMs: z.number().nonnegative().default(1000),
    bridgeTtlMs: z.number().positive().default(300_000),
    saturationGain: z.number().nonnegative().default(0),
    hostTierWeight: z.number().min(0).max(1).default(0.5),
    diskTierWeight: z.number().min(0).max(1).default(0.25),
  })
  .strict();

function source(scope: ModelScope, p: z.output<typeof params>): OverlapSource {
  const key = `kv-prefix:${p.chunkChars}:${p.maxNodesPerWorker}:${p.recentRoutingMs}:${p.bridgePending}:${p.bridgeGraceMs}:${p.bridgeTtlMs}`;
  return scope.shared(key, () => buildSource(scope, p));
}

/** The structures the overlaps are read from, for one model (shared by the steps that name the same params). */
interface SourceParts {
  readonly scope: ModelScope;
  readonly chunkChars: number;
  readonly index: PrefixIndex | undefined;
  /** The fallback estimate for workers that publish no KV events. */
  readonly tree: ApproxPrefixTree;
  readonly recent: ApproxPrefixTree | null;
  readonly pending: PendingPrefixes | null;
  readonly bridgePath: ((text: string) => number[]) | null;
}

function buildSource(scope: ModelScope, p: z.output<typeof params>): OverlapSource {
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
  const pending = p.bridgePending
    ? new PendingPrefixes({
        graceMs: p.bridgeGraceMs,
        ttlMs: p.bridgeTtlMs,
        // Peers count our announcement until we retract it: when our own entry ends.
        onEnd: scope.peers ? (w, path) => scope.peers?.retract(w, path) : undefined,
      })
    : null;
  // An eviction the events report ends the bridge's prefilled entries on that worker.
  if (pending) watchBridge(scope, index, pending);
  // The bridge keys a prompt by more of its head than the fallback tree walks (issue #28 item 4).
  const bridge = pending
    ? new ApproxPrefixTree({ chunkChars: p.chunkChars, maxChars: BRIDGE_TEXT_CAP })
    : null;
  // The step scores a prompt, then onRouted records it: one walk of its (up to 256 Ki
  // character) head serves both.
  let lastText: string | null = null;
  let lastPath: number[] = [];
  const bridgePath = (text: string): number[] => {
    if (text !== lastText) {
      lastPath = bridge ? bridge.path(text) : [];
      lastText = text;
    }
    return lastPath;
  };
  const parts: SourceParts = {
    scope,
    chunkChars: p.chunkChars,
    index,
    tree,
    recent,
    pending,
    bridgePath: bridge ? bridgePath : null,
  };
  const src: OverlapSource = {
    overlaps: (ctx: StepContext): OverlapResult => overlapsOf(parts, ctx),
    held: (id) => (index?.hasWorker(id) ? index.blockCount(id) : tree.size(id)),
    heldFromIndex: true,
    onRouted(req: RoutingRequest, worker: WorkerState, route?: RouteLifecycle) {
      recent?.insert(req.promptText(), worker.record.id);
      if (pending && bridge) {
        const path = bridgePath(req.promptText());
        // Announced before the entry exists, so a retraction (when it ends) always follows it.
        scope.peers?.announce(worker.record.id, path, req.promptTokens().length); // peer replicas
        const entry = pending.add(worker.record.id, path, {
          probe: index ? probeOf(index, req, worker.record.id) : null,
        });
        // Without a claim (a caller that sends nothing through one) nobody would end the
        // entry: it lives only its grace, or until the events confirm it.
        if (route) route.watch(entry);
        else entry.prefilled();
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
}

/** Each candidate's cached blocks of the prompt: the index's, else estimates (fallback tree, recent routing, the bridge). */
function overlapsOf(parts: SourceParts, ctx: StepContext): OverlapResult {
  const { scope, index, tree, recent, pending } = parts;
  const { req, all } = ctx;
  const n = all.length;
  const view = candidateView(all);
  const ids = view.ids;
  const tokens = req.promptTokens();
  const lora = index?.isLora(req.model) ? req.model : null;
  const ranks = ctx.rows.i32(n);
  const overlaps = index
    ? index.overlaps(tokens, ids, req.cacheSalt, lora, ranks, ctx.rows.i32(n))
    : ctx.rows.i32(n).fill(-1);
  let missing = false;
  for (let i = 0; i < n; i++) if (overlaps[i] < 0) missing = true;
  const text = recent || pending || missing ? req.promptText() : "";
  const fresh = recent ? recent.match(text, ids) : null;
  const path = parts.bridgePath ? parts.bridgePath(text) : null;
  const bridged = pending ? ctx.rows.i32(n) : undefined;
  // Characters of the prompt's text as blocks of the candidate at `i` (the trees count characters).
  const toBlocks = (i: number, chars: number) =>
    text.length > 0 ? Math.floor((ctx.promptBlocks(i) * Math.min(chars, text.length)) / text.length) : 0;
  if (missing || fresh) {
    let approx: Int32Array | null = null;
    for (let i = 0; i < n; i++) {
      if (overlaps[i] < 0) {
        // No KV events from this worker: estimate from what this server sent it.
        approx ??= tree.match(text, ids);
        overlaps[i] = toBlocks(i, approx[i]);
      }
      if (fresh && fresh[i] > 0) overlaps[i] = Math.max(overlaps[i], toBlocks(i, fresh[i]));
    }
  }
  if (pending && path && bridged) {
    const credit = (i: number, nodes: number) => {
      const b = nodes > 0 ? toBlocks(i, nodes * parts.chunkChars) : 0;
      if (b > overlaps[i]) {
        bridged[i] = b - overlaps[i];
        overlaps[i] = b;
      }
    };
    const peers = scope.peers;
    if (peers) {
      // Peer replicas' announcements (src/router/peers) are asked per candidate.
      for (let i = 0; i < n; i++) credit(i, Math.max(pending.match(ids[i], path), peers.match(ids[i], path)));
    } else {
      // Only the workers holding entries (a handful) are visited, not every candidate.
      pending.forEachMatch(path, (id, nodes) => {
        const i = view.pos.get(id);
        if (i !== undefined) credit(i, nodes);
      });
    }
  }
  return { overlaps, ranks, bridged };
}

/**
 * Hooks a bridge to the index's removals and its counters to /metrics. The listener is released
 * when the scheduler closes: the index outlives it (one per server).
 */
function watchBridge(scope: ModelScope, index: PrefixIndex | undefined, pending: PendingPrefixes): void {
  if (index?.onRemoval) scope.onClose(index.onRemoval((id) => pending.evicted(id)));
  scope.reportBridge(pending.counters);
}

/** What the index holds of `req`'s prompt on `id` now, against its full blocks (the bridge's confirmation). */
function probeOf(index: PrefixIndex, req: RoutingRequest, id: string): BridgeProbe {
  const tokens = req.promptTokens();
  const salt = req.cacheSalt;
  const lora = index.isLora(req.model) ? req.model : null;
  const ids = [id];
  return () => {
    const bs = index.blockSizeOf(id) ?? 16;
    return { held: index.overlaps(tokens, ids, salt, lora)[0], full: Math.floor(tokens.length / bs) };
  };
}

/**
 * How saturated the candidates are, for `saturationGain`: the prefill backlog of the least
 * backlogged candidate (prompt tokens not yet past their first token, this server's count) in
 * prompts of this request's size. 0 when some candidate has nothing to prefill.
 *
 * Why the prefix weighs more with it: sending a request away from its cached prefix trades its
 * own wait (prefill-backlog) for work the fleet must add (its uncached blocks). While a worker is
 * idle that work costs nobody else; once every candidate has a queue, each extra block delays
 * the requests queued behind it, roughly as many as the queues hold, so the added work counts
 * (1 + gain × s) times (bench/fleet-routing goals, chat at 1.5×: README "The kv-aware preset").
 */
function saturation(ctx: StepContext, at: readonly number[]): number {
  if (at.length === 0) return 0;
  let least = Number.POSITIVE_INFINITY;
  for (const i of at) least = Math.min(least, ctx.all[i].pendingPrefillTokens);
  const prompt = ctx.promptBlocks(at[0]) * ctx.blockSize(at[0]);
  return least > 0 ? least / Math.max(prompt, ctx.blockSize(at[0])) : 0;
}

/**
 * Offloaded tiers (src/kv/tiers.ts): blocks a worker holds in host memory or on disk beyond its
 * GPU overlap count as `hostWeight` / `diskWeight` of a GPU block (loading them is a copy over
 * PCIe or from NVMe, a fraction of recomputing them), so a prefix evicted from the GPU but
 * offloaded still attracts its follow-ups. Per position of `ctx.all`; null when nothing is
 * offloaded (no cost on the common path).
 */
function tierCredit(
  ctx: StepContext,
  o: Int32Array,
  hostWeight: number,
  diskWeight: number,
): Float64Array | null {
  const index = ctx.scope.kvIndex;
  if (!index?.tierOverlaps || (hostWeight === 0 && diskWeight === 0)) return null;
  const { req, all } = ctx;
  const lora = index.isLora(req.model) ? req.model : null;
  const t = index.tierOverlaps(req.promptTokens(), candidateView(all).ids, req.cacheSalt, lora);
  if (!t) return null;
  const out = ctx.rows.f64(all.length);
  for (let i = 0; i < all.length; i++) {
    const gpu = Math.max(0, o[i]);
    const host = Math.max(0, t.host[i] - gpu);
    const disk = Math.max(0, t.disk[i] - Math.max(gpu, t.host[i]));
    out[i] = hostWeight * host + diskWeight * disk;
  }
  return out;
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
        const w = p.saturationGain > 0 ? weight * (1 + p.saturationGain * saturation(ctx, at)) : weight;
        const credit = tierCredit(ctx, o, p.hostTierWeight, p.diskTierWeight);
        for (let k = 0; k < at.length; k++)
          out[k] = w * (ctx.promptBlocks(at[k]) - o[at[k]] - (credit ? credit[at[k]] : 0));
      },
    };
  },
});
