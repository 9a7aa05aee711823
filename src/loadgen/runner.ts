import { setMaxListeners } from "node:events";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import { Agent } from "undici";
import { BadRequestError } from "../protocol/errors.ts";
import { type ClientConfig, sendRequest } from "./client.ts";
import { Prng } from "./prng.ts";
import { type BenchConfigRecord, type BenchResult, PERCENTILE_METHOD, SCHEMA_VERSION } from "./schema.ts";
import { summarize } from "./summary.ts";
import type { BenchRequest, Endpoint, ProgressUpdate, RequestRecord, SloSpec } from "./types.ts";
import { buildWorkload, type WorkloadSpec } from "./workloads/index.ts";

export interface BenchOptions {
  url: string;
  model: string;
  /**
   * A workload to build (seeded), or a ready request list (e.g. from another benchmark). In a list,
   * each request's `index` should be its position: `after` and `replyRefs` refer to positions.
   */
  workload: WorkloadSpec | readonly BenchRequest[];
  /** Number of requests; default: all of a given list, else 100. */
  requests?: number;
  seed?: number;
  /** Poisson arrivals at this many requests/s. Unset or Infinity: all at once (traces: their timestamps). */
  rate?: number;
  /**
   * Replays a trace's arrivals this many times faster, keeping its own gaps (2 halves every gap
   * between timestamps). Default 1. Applies to `arrivalMs` only (not to Poisson --rate arrivals).
   */
  timeScale?: number;
  /** Maximum requests in flight (closed loop when no rate is given). Unset: unlimited. */
  concurrency?: number;
  /** Default true: streamed requests give TTFT and inter-token latency. */
  stream?: boolean;
  /** Fixed max_tokens for every request (overrides the workload's). */
  maxTokens?: number;
  endpoint?: Endpoint;
  apiKey?: string;
  slo?: SloSpec;
  /** Per-request timeout, default 60 s. */
  timeoutMs?: number;
  /** Stop sending new requests after this many seconds (requests in flight finish or time out). */
  durationS?: number;
  /** Adds `ignore_eos: true` (vLLM) so every request generates max_tokens. */
  ignoreEos?: boolean;
  extraBody?: Record<string, unknown>;
  headers?: Record<string, string>;
  label?: string;
  onProgress?: (p: ProgressUpdate) => void;
  signal?: AbortSignal;
}

/** Send times (ms from the run start) of the requests, or null where a request waits for nothing. */
export function arrivalSchedule(
  reqs: readonly BenchRequest[],
  rate: number | undefined,
  seed: number,
  timeScale = 1,
): number[] {
  const rng = new Prng(seed).fork("arrivals");
  const poisson = rate !== undefined && Number.isFinite(rate);
  let t = 0;
  return reqs.map((r) => {
    if (poisson) {
      t += rng.exponential(rate) * 1000;
      return t;
    }
    return (r.arrivalMs ?? 0) / timeScale;
  });
}

/** FIFO counting semaphore: the closed-loop concurrency limit. */
class Semaphore {
  private free: number;
  private waiters: Array<() => void> = [];
  constructor(free: number) {
    this.free = free;
  }
  async acquire(): Promise<void> {
    if (this.free > 0) {
      this.free--;
      return;
    }
    await new Promise<void>((resolve) => this.waiters.push(resolve));
  }
  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.free++;
  }
  /** Wakes every waiter (used when the run stops; they then see the stop flag). */
  drain(): void {
    for (const w of this.waiters.splice(0)) w();
  }
}

function workloadRecord(w: BenchOptions["workload"]): BenchConfigRecord["workload"] {
  if (Array.isArray(w)) return { kind: "custom" };
  const { lines: _lines, ...rest } = w as WorkloadSpec & { lines?: unknown };
  return rest;
}

/**
 * Runs a benchmark and returns its result (the --output JSON). Never throws for server
 * failures: they are counted by kind. Throws BadRequestError for invalid options only.
 */
export async function runBench(opts: BenchOptions): Promise<BenchResult> {
  const seed = opts.seed ?? 0;
  checkOptions(opts);
  const given = Array.isArray(opts.workload) ? (opts.workload as readonly BenchRequest[]) : null;
  const n = opts.requests ?? given?.length ?? 100;
  const reqs = given
    ? given.slice(0, n).map((r, i) => ({ ...r, index: i, maxTokens: opts.maxTokens ?? r.maxTokens }))
    : buildWorkload(opts.workload as WorkloadSpec, n, seed, opts.maxTokens);
  const schedule = arrivalSchedule(reqs, opts.rate, seed, opts.timeScale);
  const timeoutMs = opts.timeoutMs ?? 60_000;
  const dispatcher = new Agent({ keepAliveTimeout: 10_000, connections: null });
  const cfg: ClientConfig = {
    url: opts.url,
    model: opts.model,
    endpoint: opts.endpoint ?? "chat",
    stream: opts.stream ?? true,
    apiKey: opts.apiKey,
    timeoutMs,
    ignoreEos: opts.ignoreEos,
    extraBody: opts.extraBody,
    headers: opts.headers,
    dispatcher,
  };
  const sem = new Semaphore(opts.concurrency ?? Number.MAX_SAFE_INTEGER);
  const records: RequestRecord[] = [];
  const texts = new Map<number, string>();
  const finished = new Map<number, Promise<void>>();
  const doneSignals = new Map<number, () => void>();
  for (const r of reqs) finished.set(r.index, new Promise<void>((res) => doneSignals.set(r.index, res)));
  let stopped = false;
  let inFlight = 0;
  let okCount = 0;
  let lastEnd = 0;
  const runStart = performance.now();
  // stopAc cancels requests in flight (user abort only); waitAc ends the waits of unsent ones.
  const stopAc = new AbortController();
  const waitAc = new AbortController();
  // Every waiting or in-flight request listens on these: thousands of listeners are expected.
  setMaxListeners(0, stopAc.signal, waitAc.signal);
  const stopSending = () => {
    stopped = true;
    waitAc.abort();
    sem.drain();
  };
  const onUserAbort = () => {
    stopSending();
    stopAc.abort();
  };
  if (opts.signal?.aborted) onUserAbort();
  opts.signal?.addEventListener("abort", onUserAbort, { once: true });
  const durationTimer = opts.durationS !== undefined ? setTimeout(stopSending, opts.durationS * 1000) : null;
  const progress = () =>
    opts.onProgress?.({
      done: records.length,
      total: reqs.length,
      ok: okCount,
      errors: records.length - okCount,
      inFlight,
      elapsedMs: performance.now() - runStart,
    });

  const runOne = async (req: BenchRequest, at: number): Promise<void> => {
    try {
      // Timers may fire up to ~1 ms early against performance.now(): sleep until really due.
      for (let wait = at - (performance.now() - runStart); wait > 0 && !stopped; ) {
        await sleep(Math.ceil(wait), undefined, { signal: waitAc.signal }).catch(() => {});
        wait = at - (performance.now() - runStart);
      }
      if (req.after !== undefined) await finished.get(req.after);
      if (stopped) return;
      await sem.acquire();
      if (stopped) {
        sem.release();
        return;
      }
      inFlight++;
      const toSend = withReplies(req, texts);
      const { record, text } = await sendRequest(cfg, toSend, runStart, stopAc.signal);
      inFlight--;
      sem.release();
      records.push(record);
      if (record.ok) {
        okCount++;
        texts.set(req.index, text);
      }
      lastEnd = Math.max(lastEnd, performance.now() - runStart);
      progress();
    } finally {
      doneSignals.get(req.index)?.();
    }
  };

  progress();
  await Promise.all(reqs.map((r, i) => runOne(r, schedule[i])));
  if (durationTimer) clearTimeout(durationTimer);
  opts.signal?.removeEventListener("abort", onUserAbort);
  await dispatcher.close().catch(() => {});
  records.sort((a, b) => a.index - b.index);
  return resultOf(opts, cfg, { requests: reqs.length, seed, timeoutMs }, records, lastEnd);
}

/** Multi-turn with actual replies: puts the server's earlier answers into this turn's history. */
function withReplies(req: BenchRequest, texts: ReadonlyMap<number, string>): BenchRequest {
  if (!req.replyRefs || !req.messages) return req;
  const messages = req.messages.map((m) => ({ ...m }));
  for (const ref of req.replyRefs) {
    const t = texts.get(ref.requestIndex);
    if (t && messages[ref.messageIndex]) messages[ref.messageIndex].content = t;
  }
  return { ...req, messages };
}

function checkOptions(opts: BenchOptions): void {
  if (opts.rate !== undefined && !(opts.rate > 0)) throw new BadRequestError("rate must be > 0");
  if (opts.timeScale !== undefined && !(opts.timeScale > 0 && Number.isFinite(opts.timeScale)))
    throw new BadRequestError("timeScale must be a finite number > 0");
  if (opts.concurrency !== undefined && !(Number.isInteger(opts.concurrency) && opts.concurrency > 0)) {
    throw new BadRequestError("concurrency must be a positive integer");
  }
}

/** The --output JSON of a finished run. */
function resultOf(
  opts: BenchOptions,
  cfg: ClientConfig,
  run: { requests: number; seed: number; timeoutMs: number },
  records: RequestRecord[],
  lastEnd: number,
): BenchResult {
  const slo = opts.slo ?? {};
  return {
    schema_version: SCHEMA_VERSION,
    tool: "infera-bench",
    created_at: new Date().toISOString(),
    config: {
      url: opts.url,
      model: opts.model,
      endpoint: cfg.endpoint,
      workload: workloadRecord(opts.workload),
      requests: run.requests,
      seed: run.seed,
      rate: opts.rate !== undefined && Number.isFinite(opts.rate) ? opts.rate : null,
      concurrency: opts.concurrency ?? null,
      time_scale: opts.timeScale ?? 1,
      stream: cfg.stream,
      max_tokens: opts.maxTokens ?? null,
      timeout_ms: run.timeoutMs,
      duration_cap_s: opts.durationS ?? null,
      slo,
      percentile_method: PERCENTILE_METHOD,
      label: opts.label ?? null,
    },
    summary: summarize(records, { requested: run.requests, durationMs: lastEnd, slo }),
    requests: records,
  };
}
