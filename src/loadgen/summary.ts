import { type Distribution, distribution } from "./percentiles.ts";
import type { RequestRecord, SloSpec } from "./types.ts";

export interface BenchSummary {
  /** Every requested request lands in exactly one of ok, errors, not_sent. */
  requests: { requested: number; sent: number; ok: number; errors: number; not_sent: number };
  /** Failed requests by kind: http_<status>, connection, timeout, malformed, stream_error, cancelled. */
  errors_by_kind: Record<string, number>;
  /** Wall time from the first send to the last answer, the denominator of every rate. */
  duration_s: number;
  throughput: {
    requests_per_s: number;
    input_tokens_per_s: number;
    output_tokens_per_s: number;
    total_tokens_per_s: number;
  };
  /** Token sums over successful requests, from `usage` (completion falls back to chunk counts). */
  tokens: { prompt: number; completion: number; cached: number; usage_missing: number };
  /** cached / prompt tokens over successful requests that reported usage; null without prompt tokens. */
  prefix_cache_hit_rate: number | null;
  /** Over successful requests. itl pools every chunk gap of every request. */
  latency_ms: { ttft: Distribution; itl: Distribution; tpot: Distribution; e2e: Distribution };
  /** Requests that succeeded and met every given SLO; null when no SLO was given. */
  goodput: {
    slo: SloSpec;
    good: number;
    fraction: number;
    requests_per_s: number;
  } | null;
}

export interface SummarizeOptions {
  /** How many requests the workload asked for (defaults to the number of records). */
  requested?: number;
  /** Benchmark wall time in ms; defaults to first start → last end over the records. */
  durationMs?: number;
  slo?: SloSpec;
}

function hasSlo(slo: SloSpec | undefined): slo is SloSpec {
  return (
    slo !== undefined && (slo.ttft_ms !== undefined || slo.itl_ms !== undefined || slo.e2e_ms !== undefined)
  );
}

/** Whether a successful request met the SLO: ttft ≤ X, mean inter-token latency (TPOT) ≤ Y, e2e ≤ Z. */
export function meetsSlo(r: RequestRecord, slo: SloSpec): boolean {
  if (!r.ok) return false;
  if (slo.ttft_ms !== undefined && (r.ttft_ms ?? Number.POSITIVE_INFINITY) > slo.ttft_ms) return false;
  if (slo.e2e_ms !== undefined && (r.e2e_ms ?? Number.POSITIVE_INFINITY) > slo.e2e_ms) return false;
  // A request with fewer than two tokens has no inter-token gap and cannot miss the ITL SLO.
  if (slo.itl_ms !== undefined && r.tpot_ms !== null && r.tpot_ms > slo.itl_ms) return false;
  return true;
}

export function summarize(records: readonly RequestRecord[], opts: SummarizeOptions = {}): BenchSummary {
  const requested = opts.requested ?? records.length;
  const ok = records.filter((r) => r.ok);
  const errorsByKind: Record<string, number> = {};
  for (const r of records)
    if (!r.ok) errorsByKind[r.error ?? "unknown"] = (errorsByKind[r.error ?? "unknown"] ?? 0) + 1;
  let durationMs = opts.durationMs;
  if (durationMs === undefined) {
    let first = Number.POSITIVE_INFINITY;
    let last = 0;
    for (const r of records) {
      first = Math.min(first, r.start_ms);
      last = Math.max(last, r.start_ms + (r.e2e_ms ?? 0));
    }
    durationMs = records.length > 0 ? last - first : 0;
  }
  const durS = durationMs / 1000;
  const rate = (x: number) => (durS > 0 ? x / durS : 0);
  let prompt = 0;
  let completion = 0;
  let cached = 0;
  let usageMissing = 0;
  let promptForHit = 0;
  for (const r of ok) {
    prompt += r.prompt_tokens ?? 0;
    completion += r.completion_tokens ?? 0;
    if (r.usage_reported) {
      cached += r.cached_tokens ?? 0;
      promptForHit += r.prompt_tokens ?? 0;
    } else usageMissing++;
  }
  const itl: number[] = [];
  for (const r of ok) for (const g of r.itl_ms) itl.push(g);
  const vals = (f: (r: RequestRecord) => number | null) =>
    ok.map(f).filter((v): v is number => v !== null && Number.isFinite(v));
  let goodput: BenchSummary["goodput"] = null;
  if (hasSlo(opts.slo)) {
    const slo = opts.slo;
    const good = ok.filter((r) => meetsSlo(r, slo)).length;
    goodput = { slo, good, fraction: requested > 0 ? good / requested : 0, requests_per_s: rate(good) };
  }
  return {
    requests: {
      requested,
      sent: records.length,
      ok: ok.length,
      errors: records.length - ok.length,
      not_sent: Math.max(0, requested - records.length),
    },
    errors_by_kind: errorsByKind,
    duration_s: durS,
    throughput: {
      requests_per_s: rate(ok.length),
      input_tokens_per_s: rate(prompt),
      output_tokens_per_s: rate(completion),
      total_tokens_per_s: rate(prompt + completion),
    },
    tokens: { prompt, completion, cached, usage_missing: usageMissing },
    prefix_cache_hit_rate: promptForHit > 0 ? cached / promptForHit : null,
    latency_ms: {
      ttft: distribution(vals((r) => r.ttft_ms)),
      itl: distribution(itl),
      tpot: distribution(vals((r) => r.tpot_ms)),
      e2e: distribution(vals((r) => r.e2e_ms)),
    },
    goodput,
  };
}
