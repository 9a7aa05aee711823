/**
 * Router contracts. The server parses and validates a request into a `RoutingRequest`,
 * asks the `AutoRouter` for the model's router (`MixedRouter` or `DisaggRouter`), and hands
 * it a `RequestExecutor` that knows how to send a body to a worker over the request plane
 * (HTTP or NATS; the contract is src/transport/types.ts). The router returns the upstream
 * response the server streams to the client.
 * Workers are ranked by the scheduling pipeline (./pipeline): a model's `Scheduler` implements
 * `RoutingPolicy` from the profiles that `buildScheduling` (./pipeline/build.ts) resolves from
 * a preset (./pipeline/presets.ts) and the config's `profiles`; each filter, scorer and picker
 * is one file and one import line in ./pipeline/registry.ts.
 */
import type { WorkerRecord } from "../discovery/types.ts";
import type {
  EndpointKind,
  FailureKind,
  RequestExecutor,
  RoutedEndpoint,
  SendOptions,
  UpstreamResponse,
} from "../transport/types.ts";
import type { AbortLike } from "../util/abort.ts";
import type { Logger } from "../util/log.ts";
import type { RequestTrace } from "./trace.ts";

// The request plane's contract, re-exported for the modules that read it from the router.
export type { EndpointKind, RequestExecutor, RoutedEndpoint, SendOptions, UpstreamResponse };

export interface RoutingRequest {
  requestId: string;
  /** The model name the client asked for. */
  model: string;
  endpoint: RoutedEndpoint;
  /** The validated OpenAI body; routers copy it before adding fields. */
  body: Readonly<Record<string, unknown>>;
  stream: boolean;
  /** vLLM `cache_salt`, when given: enters the first block's hash. */
  cacheSalt?: string;
  /** The templated prompt text (chat template applied), computed once on first use. */
  promptText(): string;
  /** Token ids of the templated prompt with the model's tokenizer, computed once on first use. */
  promptTokens(): readonly number[];
  /**
   * One of the client's request headers (lower-case name; the first value when repeated), for
   * plugins that take per-request hints (`x-infera-ttft-target-ms`, `x-session-id`); absent
   * where requests do not come from HTTP.
   */
  header?(name: string): string | undefined;
  /** The request's trace when tracing is on (./trace.ts); undefined otherwise. */
  trace?: RequestTrace;
  /** Flow control's admission (src/router/flow/queue.ts), when the request passed the queue. */
  admission?: RouteAdmission;
}

/**
 * What the admission queue tells the router and wants to hear back: the workers that had
 * headroom when the request was let through (the MixedRouter keeps to them while any is a
 * candidate), and the worker picked (headroom signals count it).
 */
export interface RouteAdmission {
  readonly fits: ReadonlySet<string>;
  routed(worker: WorkerState): void;
}

/** The server's live view of one worker. */
export interface WorkerState {
  readonly record: WorkerRecord;
  /** Requests this server has in flight on the worker. */
  inFlight: number;
  /** Prompt tokens of in-flight requests not yet past their first token (prefill backlog). */
  pendingPrefillTokens: number;
  /** Last scraped engine load (vLLM/SGLang/ATOM `/metrics`), if any. */
  engineLoad?: EngineLoad;
  /** False while the circuit breaker has the worker out of rotation. */
  available: boolean;
  /** Requests this server sent to the worker (lifetime), where the server keeps the count. */
  routed?: number;
}

export interface EngineLoad {
  running: number;
  /** Queued requests, PD backlog (`pdBacklog`) included. */
  waiting: number;
  /**
   * Requests a PD worker holds in its transfer queues (SGLang's bootstrap/prealloc/inflight/
   * transfer queues, ATOM's parked KV loads), when the engine exports them.
   */
  pdBacklog?: number;
  /** 0..1 */
  kvUsage: number;
  scrapedAt: number;
}

export interface Selection {
  worker: WorkerState;
  /** Cached prefix blocks the policy believes the worker holds for this request. */
  overlapBlocks?: number;
  /** Short machine-readable reason, logged and counted ("round-robin", "overlap", "load-balance"). */
  reason: string;
  /**
   * The data-parallel rank of `worker` the request should run on (its cache hit is there), when
   * the policy pins one; the mixed router sends it as vLLM's `X-data-parallel-rank` header.
   */
  dpRank?: number;
  /**
   * Seconds the policy took to choose (the pipeline scheduler times its own step, prompt
   * tokenizing and the KV index lookup included); the server's decision-time histogram.
   */
  seconds?: number;
}

/**
 * What a policy may hear of a routed request's course on its worker (the pending bridge listens):
 * exactly one of the two, once.
 */
export interface ClaimWatcher {
  /** The worker finished the prompt's prefill: first byte of a successful answer (or the whole of it). */
  prefilled(): void;
  /** The request ended before that: `failed` (connection, error status, broken stream) or `cancelled` (the client went away). */
  dropped(reason: "failed" | "cancelled"): void;
}

/** A routed request's hold on its worker, as the router hands it to the policy (a `WorkerClaim`). */
export interface RouteLifecycle {
  watch(w: ClaimWatcher): void;
}

export interface RoutingPolicy {
  readonly name: string;
  /** Picks one worker from a non-empty list of available candidates. */
  select(req: RoutingRequest, candidates: readonly WorkerState[]): Selection;
  /**
   * Told after a request was sent to a worker (approx-prefix learns from this); `route`, when the
   * router has one, reports how the request's prefill there ends.
   */
  onRouted?(req: RoutingRequest, worker: WorkerState, route?: RouteLifecycle): void;
  onWorkerRemoved?(workerId: string): void;
  /** Releases listeners it holds on shared state (the KV index); the router calls it on close. */
  close?(): void;
  /** Its pending bridges' counters summed (a pipeline Scheduler with `bridgePending`), for /metrics. */
  bridgeCounters?(): Readonly<Record<string, number>> | undefined;
  /**
   * Per candidate (same positions), the prompt tokens the policy believes that worker holds in
   * cache (its overlap source: the KV index, the pending bridge, peers' announcements); null when
   * the policy reads no prefix. Records no decision. Flow control's locality reads it
   * (src/router/flow/locality.ts).
   */
  cachedTokens?(req: RoutingRequest, candidates: readonly WorkerState[]): readonly number[] | null;
}

/** MixedRouter and DisaggRouter implement this; AutoRouter picks one per model. */
export interface ModelRouter {
  readonly kind: "mixed" | "disagg";
  handle(req: RoutingRequest, exec: RequestExecutor, signal: AbortLike): Promise<UpstreamResponse>;
}

/** What AutoRouter gives the DisaggRouter factory for one model. */
/** The server config's `disagg` section, as the DisaggRouter factory receives it. */
export type DisaggSettings = {
  prefillTimeoutMs?: number;
  decodeTimeoutMs?: number;
  pdFallbackMixed?: boolean;
  maxPrefillAttempts?: number;
};

export interface DisaggFactoryContext {
  model: string;
  /** Live, available prefill workers of the model (re-read on every request). */
  prefillWorkers(): readonly WorkerState[];
  /** Live, available decode workers of the model. */
  decodeWorkers(): readonly WorkerState[];
  /**
   * The model's policy, for choosing the pair: a pipeline `Scheduler`'s `prefill` and `decode`
   * steps choose P and D; a plain RoutingPolicy chooses P, and D is least-load.
   */
  policy: RoutingPolicy;
  logger: Logger;
  /** The policy preset's knobs (`policyOptions`). */
  options: Readonly<Record<string, unknown>>;
  /**
   * Count P's prompt tokens into its `pendingPrefillTokens` (costs a tokenization): the
   * scheduling's needs decide it (`Scheduling.trackPrefill`), as for the MixedRouter. Absent:
   * counted.
   */
  trackPrefill?: boolean;
  /** The server config's `disagg` section (validated); absent = the factory's defaults. */
  disagg?: DisaggSettings;
  /** Additive: the circuit breaker's inputs (only connection errors and 5xx count), when the server has one. */
  reportFailure?(worker: WorkerState, kind: FailureKind): void;
  reportSuccess?(worker: WorkerState): void;
}

export type DisaggRouterFactory = (ctx: DisaggFactoryContext) => ModelRouter;
