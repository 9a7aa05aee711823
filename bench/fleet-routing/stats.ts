/**
 * Figures of one rate step, in model time: the sims' `--speed s` runs the modelled GPU s times
 * faster than real time, so a wall-clock latency times s is the modelled one, and a wall rate
 * divided by s the modelled rate. With s = 1 (the default) both are the same.
 */
import { percentile } from "../../src/loadgen/percentiles.ts";
import type { RequestRecord } from "../../src/loadgen/types.ts";
import type { Reuse } from "./trace.ts";

export interface Slo {
  ttftMs: number;
  itlMs: number;
}

export interface CpuShare {
  /** The engines' process(es): % of one core over the step, and % of the whole box. */
  fleetCore: number;
  fleetBox: number;
  /** All server replicas together, % of one core. */
  serversCore: number;
  /** This process (load generator and balancer), % of one core. */
  benchCore: number;
  /** 1-minute load average at the step's end. */
  load1: number;
}

export interface StepFigures {
  /** Offered rate, requests per model second. */
  rate: number;
  requests: number;
  ok: number;
  /** Requests still unanswered when the step gave up on them (drain limit); they miss the SLO. */
  unfinished: number;
  errors: number;
  /** Model ms. Unfinished requests count with the time they had waited (a lower bound). */
  ttftP50: number;
  ttftP90: number;
  ttftP99: number;
  /** Model ms, pooled over every chunk gap of every finished request. */
  itlP50: number;
  /** Finished requests per model second (first send to last answer). */
  throughput: number;
  /** Requests per model second that met both SLO parts (over the same span). */
  goodput: number;
  /** Requests that met both SLO parts (a 429 or an unfinished one never does). */
  good: number;
  /** Σ cached / Σ prompt tokens of the finished requests, from the engines' usage. */
  hitRate: number;
  /** The same requests' reachable reuse (never-evicting cache over the whole run) / prompt tokens. */
  reachableRate: number;
  /** hitRate / reachableRate. */
  ofReachable: number;
  cachedTokens: number;
  promptTokens: number;
  wallS: number;
  cpu: CpuShare;
}

/**
 * Figures of one step from the client's records. `abortMs` is when the step gave up on the
 * requests still running (ms from the run start; Infinity when every request finished).
 */
export function stepFigures(
  rate: number,
  records: readonly RequestRecord[],
  requested: number,
  reuse: Reuse,
  o: { speed: number; slo: Slo; abortMs: number; wallS: number; cpu: CpuShare },
): StepFigures {
  const s = o.speed;
  const ok = records.filter((r) => r.ok);
  const failed = records.filter((r) => !r.ok);
  const unfinished = failed.filter((r) => r.error === "cancelled").length + (requested - records.length);
  const ttft = [
    ...ok.map((r) => (r.ttft_ms ?? 0) * s),
    ...failed.map((r) =>
      r.error === "cancelled" && Number.isFinite(o.abortMs)
        ? (o.abortMs - r.start_ms) * s
        : Number.POSITIVE_INFINITY,
    ),
  ].sort((a, b) => a - b);
  const itl = ok.flatMap((r) => r.itl_ms.map((g) => g * s)).sort((a, b) => a - b);
  let first = Number.POSITIVE_INFINITY;
  let last = 0;
  for (const r of ok) {
    first = Math.min(first, r.start_ms);
    last = Math.max(last, r.start_ms + (r.e2e_ms ?? 0));
  }
  const spanModelS = ok.length > 0 ? ((last - first) / 1000) * s : 0;
  const good = ok.filter(
    (r) => (r.ttft_ms ?? Number.POSITIVE_INFINITY) * s <= o.slo.ttftMs && (r.tpot_ms ?? 0) * s <= o.slo.itlMs,
  ).length;
  let cached = 0;
  let prompt = 0;
  let reachable = 0;
  for (const r of ok) {
    cached += r.cached_tokens ?? 0;
    prompt += r.prompt_tokens ?? 0;
    const pr = reuse.perRequest[r.index];
    reachable += pr ? (pr.reachable / pr.prompt) * (r.prompt_tokens ?? pr.prompt) : 0;
  }
  const hitRate = prompt > 0 ? cached / prompt : 0;
  const reachableRate = prompt > 0 ? reachable / prompt : 0;
  const pc = (p: number) => percentile(ttft, p) ?? Number.NaN;
  return {
    rate,
    requests: requested,
    ok: ok.length,
    unfinished,
    errors: failed.length - failed.filter((r) => r.error === "cancelled").length,
    ttftP50: pc(50),
    ttftP90: pc(90),
    ttftP99: pc(99),
    itlP50: percentile(itl, 50) ?? Number.NaN,
    throughput: spanModelS > 0 ? ok.length / spanModelS : 0,
    goodput: spanModelS > 0 ? good / spanModelS : 0,
    good,
    hitRate,
    reachableRate,
    ofReachable: reachableRate > 0 ? hitRate / reachableRate : 0,
    cachedTokens: cached,
    promptTokens: prompt,
    wallS: o.wallS,
    cpu: o.cpu,
  };
}

/** One policy × replica count over the rate steps. */
export interface RunRecord {
  workers: number;
  policy: string;
  replicas: number;
  /** The warm-up stage (one request per tenant), not part of the goals. */
  warmup?: StepFigures;
  steps: StepFigures[];
  decisions: string;
  /** Per engine over the whole run (warm-up included): requests finished and preemptions. */
  perWorkerRequests: number[];
  preemptions: number;
}

export interface HotRecord {
  policy: string;
  rate: number;
  dominantShare: number;
  perWorker: Array<{ requests: number; prefillTokens: number }>;
  maxOverMeanRequests: number;
  maxOverMeanPrefill: number;
  step: StepFigures;
}

/** Whether a step met the SLO as the goals read it: TTFT p90 and ITL p50 within their bounds. */
export function meetsSlo(f: StepFigures, slo: Slo): boolean {
  return f.ttftP90 <= slo.ttftMs && f.itlP50 <= slo.itlMs;
}
