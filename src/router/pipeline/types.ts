/**
 * The scheduling pipeline's contracts (llm-d's filters → scorers → picker, per step profile).
 *
 * One step (`mixed`, `prefill` or `decode`) of one request:
 *
 *   candidates ─► filters (narrow) ─► scorers (one weighted number per candidate, summed)
 *              ─► picker (one winner from the totals) ─► Selection + DecisionExplanation
 *
 * Totals are costs: lower is better. Plugins address candidates by their position in
 * `StepContext.all` (the list the router handed in), so per-candidate signals computed once
 * (prefix overlap, held blocks) are shared by every plugin of the step without maps.
 */

import type { PrefixIndex } from "../../kv/prefix-index.ts";
import type { Logger } from "../../util/log.ts";
import type { PeerRouting } from "../peers/types.ts";
import type { TtftPredictor } from "../predict/ttft.ts";
import type { RouteLifecycle, RoutingRequest, WorkerState } from "../types.ts";
import type { Step } from "./decision-wire.ts";
import type { BridgeCounters } from "./pending-prefixes.ts";
import type { RowArena } from "./rows.ts";

/** What a plugin reads; the server starts the matching machinery from the union of them. */
export type Need =
  /** The KV prefix index fed by the engines' KV events (the server starts KV ingest). */
  | "kvIndex"
  /** The prompt's token ids (the server tokenizes ahead and counts prefill backlog). */
  | "promptTokens"
  /** Engine load scraped from each worker's `/metrics` (the server starts the scraper). */
  | "engineLoad"
  /** The templated prompt text for this server's approximate prefix tree. */
  | "approxTree";

export type Needs = ReadonlySet<Need>;

// The decision's own types have no imports (the dashboard page reads them too): ./decision-wire.ts.
export type { DecisionExplanation, Step } from "./decision-wire.ts";

/** Per-model state shared by every plugin of every step (one model = one scheduler). */
export interface ModelScope {
  readonly model: string;
  readonly logger: Logger;
  /** The shared KV prefix index, when the server ingests KV events. */
  readonly kvIndex?: PrefixIndex;
  /** Peer replicas' routed prefixes (src/router/peers), when the server shares routing state. */
  readonly peers?: PeerRouting;
  /** The server's TTFT predictor (src/router/predict), when it keeps one (`predictorOf`). */
  readonly ttft?: TtftPredictor;
  /**
   * The object stored under `key`, made on first use. Plugins that must see the same state in
   * every step (the round-robin turn, the prefill ledger, an approximate tree) share it by key,
   * as the single policy instance of a model did before profiles.
   */
  shared<T>(key: string, make: () => T): T;
  /** Runs `fn` when the model's scheduler closes (listeners to unsubscribe, timers to stop). */
  onClose(fn: () => void): void;
  /** Counters of a pending bridge (pending-prefixes.ts), exported per model at /metrics. */
  reportBridge(counters: Readonly<BridgeCounters>): void;
}

/** A per-candidate signal a plugin computes once per step and others read (overlap, held). */
export interface OverlapSource {
  /**
   * Cached prefix blocks of the prompt per candidate of `ctx.all` (fallback estimates
   * included), and the best DP rank per candidate (-1 when none).
   */
  overlaps(ctx: StepContext): OverlapResult;
  /** Blocks the worker holds (events) or is believed to hold (its cache pressure). */
  held(id: string): number;
  /**
   * True when `held(id)` is the KV index's `blockCount(id)` wherever the index `hasWorker(id)`
   * (a fallback elsewhere): the step may then read the index's counts for all candidates in one
   * pass (PrefixIndex.candidateRows) and ask `held` only for the others.
   */
  readonly heldFromIndex?: boolean;
  /**
   * Told after a step of this profile routed a request (fallback trees learn here); `route`
   * reports how its prefill there ends (the pending bridge).
   */
  onRouted?(req: RoutingRequest, worker: WorkerState, route?: RouteLifecycle): void;
  onWorkerRemoved?(id: string): void;
}

export interface OverlapResult {
  overlaps: Int32Array;
  ranks: Int32Array;
  /**
   * Per candidate, the blocks the pending bridge credited beyond what the index (or the
   * fallback tree) holds; absent when the source has no bridge.
   */
  bridged?: Int32Array;
}

/** One request in one step: the inputs, lazily computed shared signals, the decision so far. */
export interface StepContext {
  readonly req: RoutingRequest;
  readonly step: Step;
  readonly scope: ModelScope;
  /** Every candidate the router gave, before filters. Positions index into this. */
  readonly all: readonly WorkerState[];
  /**
   * Zeroed per-candidate rows for this decision (./rows.ts): valid through the step's next
   * decision, never longer; copy what must outlive it.
   */
  readonly rows: RowArena;
  /** Prefix overlap per position of `all` (zeros when the profile has no overlap source). */
  overlaps(): Int32Array;
  /** The best DP rank per position of `all` (-1 when none or unknown). */
  ranks(): Int32Array;
  /** Blocks of `overlaps()` credited by the pending bridge per position; null without a bridge. */
  bridged(): Int32Array | null;
  /** Full prompt blocks for the candidate at a position (its block size). */
  promptBlocks(pos: number): number;
  /** `promptBlocks` for every position at once (a row of this decision: read, never keep). */
  promptBlocksRow(): Int32Array;
  /** The candidate's block size (index, else record, else 16). */
  blockSize(pos: number): number;
  /** Held blocks of the candidate at a position (cache pressure), from the overlap source. */
  held(pos: number): number;
  /** Request load per position (`max(inFlight, running + waiting)`), computed once. */
  loads(): Float64Array;
  /** Set by a filter or picker that decided for a reason of its own (e.g. "load-balance"). */
  reason?: string;
}

/** Narrows the candidates (positions into `ctx.all`); returns the kept positions, in order. */
export interface Filter {
  readonly name: string;
  readonly needs: readonly Need[];
  filter(ctx: StepContext, at: readonly number[]): readonly number[];
  /**
   * Told after a step of this profile routed a request (filters that keep a history); `ctx` is
   * the step that chose (null when unknown), `route` how the request's prefill there ends.
   */
  onRouted?(req: RoutingRequest, worker: WorkerState, ctx?: StepContext | null, route?: RouteLifecycle): void;
  onWorkerRemoved?(id: string): void;
}

/**
 * Adds one weighted number per candidate to the totals. `out[k]` receives the contribution of
 * candidate `at[k]` with `weight` applied (usually `weight × value`; a scorer may apply it in
 * another float order when it must reproduce an older formula bit for bit).
 */
export interface Scorer {
  readonly name: string;
  readonly needs: readonly Need[];
  score(ctx: StepContext, at: readonly number[], weight: number, out: Float64Array): void;
  /** Provides the step's prefix overlap (the kv-prefix scorer). */
  readonly overlapSource?: OverlapSource;
  /** Provides held blocks (cache pressure) when the profile has no overlap source. */
  readonly cacheView?: { held(id: string): number };
  /** `route`: how the request's prefill on `worker` ends (the dispatch claim), when the router has one. */
  onRouted?(req: RoutingRequest, worker: WorkerState, ctx: StepContext | null, route?: RouteLifecycle): void;
  onWorkerRemoved?(id: string): void;
}

/** Chooses one candidate from the totals: returns k, an index into `at` (and `totals`). */
export interface Picker {
  readonly name: string;
  readonly needs: readonly Need[];
  pick(ctx: StepContext, at: readonly number[], totals: Float64Array): number;
  onRouted?(req: RoutingRequest, worker: WorkerState): void;
  onWorkerRemoved?(id: string): void;
}

/** How a plugin is named in a profile: registry name plus its own params. */
export interface PluginRef {
  name: string;
  params?: Record<string, unknown>;
}

export interface ScorerRef extends PluginRef {
  weight: number;
}

/** One step's pipeline, as the config file and the presets write it. */
export interface ProfileSpec {
  filters?: PluginRef[];
  scorers: ScorerRef[];
  picker: PluginRef;
}

export type ProfileSet = Record<Step, ProfileSpec>;
