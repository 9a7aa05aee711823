import { PERCENTILE_METHOD } from "./percentiles.ts";
import type { BenchSummary } from "./summary.ts";
import type { Endpoint, RequestRecord, SloSpec } from "./types.ts";

/**
 * Version of the JSON result layout. Bump it on any change that renames or removes a key or
 * changes a unit; adding a key is compatible and keeps the version.
 */
export const SCHEMA_VERSION = 1;

export interface BenchConfigRecord {
  url: string;
  model: string;
  endpoint: Endpoint;
  /** Workload name (synthetic, multi-turn, doc-qa, trace) and its parameters. */
  workload: { kind: string } & Record<string, unknown>;
  requests: number;
  seed: number;
  /** Poisson arrival rate in requests/s; null = all at once (or trace timestamps). */
  rate: number | null;
  /** Maximum requests in flight; null = unlimited. */
  concurrency: number | null;
  /** Trace arrivals replayed this many times faster (gaps ÷ time_scale); 1 = as recorded. */
  time_scale: number;
  stream: boolean;
  max_tokens: number | null;
  timeout_ms: number;
  duration_cap_s: number | null;
  slo: SloSpec;
  /** How percentiles are computed (see src/loadgen/percentiles.ts). */
  percentile_method: string;
  /** Free label a caller sets to tell runs apart (e.g. "round-robin", "kv-aware"). */
  label: string | null;
}

/** The whole result of a run: what `runBench` returns and what --output writes. */
export interface BenchResult {
  schema_version: number;
  tool: "infera-bench";
  created_at: string;
  config: BenchConfigRecord;
  summary: BenchSummary;
  /** One record per sent request, ordered by index. */
  requests: RequestRecord[];
}

/** Top-level and summary keys of the schema, checked by the tests so that changes are deliberate. */
export const RESULT_KEYS = ["schema_version", "tool", "created_at", "config", "summary", "requests"] as const;
export const SUMMARY_KEYS = [
  "requests",
  "errors_by_kind",
  "duration_s",
  "throughput",
  "tokens",
  "prefix_cache_hit_rate",
  "latency_ms",
  "goodput",
] as const;
export const RECORD_KEYS = [
  "index",
  "group",
  "ok",
  "error",
  "error_message",
  "start_ms",
  "ttft_ms",
  "e2e_ms",
  "itl_ms",
  "tpot_ms",
  "prompt_tokens",
  "completion_tokens",
  "cached_tokens",
  "usage_reported",
  "chunks",
] as const;

export { PERCENTILE_METHOD };

/** Parses and checks a result file's JSON (for --compare): throws on another schema version. */
export function parseResult(text: string, name = "result"): BenchResult {
  const obj = JSON.parse(text) as Partial<BenchResult>;
  if (obj.tool !== "infera-bench" || typeof obj.schema_version !== "number") {
    throw new Error(`${name}: not an infera bench result`);
  }
  if (obj.schema_version !== SCHEMA_VERSION) {
    throw new Error(`${name}: schema_version ${obj.schema_version}, this tool reads ${SCHEMA_VERSION}`);
  }
  if (!obj.summary || !obj.config) throw new Error(`${name}: missing summary or config`);
  return obj as BenchResult;
}
