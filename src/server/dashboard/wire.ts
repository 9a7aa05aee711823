/**
 * GET /dashboard/state's JSON: what ./state.ts and ./window.ts produce and what the page
 * (web/dashboard/main.ts) reads. Types only, and no node imports: the page is bundled for the
 * browser and type-checked with the DOM lib and no node types, and imports this module too.
 */
import type { DecisionExplanation, DecisionExplanationJson } from "../../router/pipeline/decision-wire.ts";

export type WorkerHealth = "healthy" | "breaker-open" | "half-open" | "draining";

export interface DashboardWorker {
  id: string;
  url: string;
  role: string;
  engine: string;
  connector: string;
  state: WorkerHealth;
  inFlight: number;
  /** Requests this server sent it (lifetime). */
  routed: number;
  /** From the engine's /metrics (null until scraped). */
  running: number | null;
  waiting: number | null;
  kvUsage: number | null;
  /** Blocks the KV index holds for it (null when the index does not track it). */
  indexBlocks: number | null;
  /**
   * Whether the KV index's view of it is in sync (its least synced rank; src/kv/prefix-index.ts):
   * `syncing` (start-up replay running), `synced`, `unknown` (history could not be had: routed
   * on what this server sent it); null when the index does not track it.
   */
  indexSync: KvIndexSync | null;
}

export type KvIndexSync = "syncing" | "synced" | "unknown";

/** The KV index's sync per worker rank, with counts (the same counts GET /ready gives). */
export interface KvIndexSyncView {
  synced: number;
  syncing: number;
  unknown: number;
  ranks: Array<{ worker: string; rank: number; state: KvIndexSync; syncMs: number | null }>;
}

export interface PdTransfer {
  requestId: string;
  prefill: string;
  decode: string;
  at: number;
}

export interface Percentiles {
  p50: number | null;
  p90: number | null;
  p99: number | null;
}

export interface TrafficPoint {
  /** Epoch milliseconds (end of the interval). */
  t: number;
  rps: number;
  /** Seconds. */
  ttft: Percentiles;
  itl: Percentiles;
  e2e: Percentiles;
  /** Cached / prompt tokens over the interval (index view), or null without prompt tokens. */
  cacheHitRate: number | null;
}

export interface TrafficView {
  /** Seconds each point's percentiles and rates are computed over. */
  windowSeconds: number;
  series: TrafficPoint[];
  totals: { requests: number; promptTokens: number };
}

export interface DashboardModel {
  name: string;
  router: "mixed" | "disagg" | null;
  workers: DashboardWorker[];
  pd: { pairs: Array<{ prefill: string; decode: string; count: number }>; transfers: PdTransfer[] };
  traffic: TrafficView;
}

/** Flow control's admission queue (src/router/flow), when the server runs it. */
export interface FlowView {
  /** Requests waiting now. */
  depth: number;
  /** Highest band first; flows are tenant names or `key-<digest>` (never a key itself). */
  bands: Array<{
    band: string;
    oldestMs: number;
    flows: Array<{ flow: string; depth: number; counter: number }>;
  }>;
  /** Refusals since start by reason (queue_full, queue_timeout, rate_limit_rpm, rate_limit_tpm, no_worker, cancelled). */
  rejected: Record<string, number>;
  /** Queue waits (ms) of the last ≤ 200 requests that waited. */
  waits: { count: number; p50: number | null; p90: number | null; max: number | null };
}

/**
 * The snapshot. `D` is the decisions' form: `DecisionExplanation` as the server builds it, the
 * JSON form (a filtered candidate's NaN total read back as null) as the page parses it; the
 * first is assignable to the second.
 */
export interface DashboardSnapshot<D extends DecisionExplanationJson = DecisionExplanationJson> {
  object: "dashboard.state";
  at: number;
  server: { policy: string; draining: boolean; decisionCapacity: number };
  models: DashboardModel[];
  /** Per-rank KV index sync; absent when the server ingests no KV events. */
  kvIndex?: KvIndexSyncView;
  /**
   * The TTFT predictor's relative error |predicted − observed| / observed over its last
   * observations, per model; absent or empty until a profile uses the predictor.
   */
  ttftPrediction?: Array<{ model: string; samples: number; median: number; p90: number }>;
  /** The admission queue; absent without flow control. */
  flow?: FlowView;
  /** The newest routing decisions, newest first. */
  decisions: D[];
}

/** What DashboardState.snapshot returns, before serialisation. */
export type DashboardSnapshotValue = DashboardSnapshot<DecisionExplanation>;

export type { CandidateExplanation, DecisionExplanationJson } from "../../router/pipeline/decision-wire.ts";
