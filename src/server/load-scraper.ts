/**
 * Periodic GET of each worker's `/metrics`, parsed into `WorkerState.engineLoad`. The gauge
 * names come from the worker record's engine kind (never by trying which names appear):
 *
 * - vLLM (and the sim, which exports vLLM's names): `vllm:num_requests_running`,
 *   `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (the current name; the older
 *   `vllm:gpu_cache_usage_perc` is read too, once per label set) — vllm-project/vllm
 *   vllm/v1/metrics/loggers.py @ a6f0308.
 * - SGLang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`, and a
 *   PD worker's backlog gauges `sglang:num_prefill_prealloc_queue_reqs` (newer:
 *   `..._bootstrap_queue_reqs`), `sglang:num_prefill_inflight_queue_reqs`,
 *   `sglang:num_decode_prealloc_queue_reqs`, `sglang:num_decode_transfer_queue_reqs`
 *   (sgl-project/sglang python/sglang/srt/metrics/collector.py @ 93d0487), counted as waiting
 *   work: a decode worker whose transfer queue is long is busy although it runs little.
 * - ATOM: `atom:requests_running`, `atom:requests_waiting`, `atom:kv_cache_usage_ratio`, and
 *   `atom:requests_parked_kv_load` (waiting for a PD KV load) as backlog
 *   (ROCm/ATOM atom/entrypoints/openai/metrics.py @ ffdf3bb).
 *
 * Sums over label sets (several engines / dp ranks behind one URL). One scrape per worker at a
 * time; failures are ignored (the breaker, not the scraper, decides availability).
 */
import { request } from "undici";
import type { EngineKind } from "../discovery/types.ts";
import type { EngineLoad } from "../router/types.ts";
import type { LiveWorker, WorkerSet } from "../router/worker-set.ts";

type Field = "running" | "waiting" | "kvUsage" | "backlog";

const VLLM: Record<string, Field> = {
  "vllm:num_requests_running": "running",
  "vllm:num_requests_waiting": "waiting",
  "vllm:kv_cache_usage_perc": "kvUsage",
  "vllm:gpu_cache_usage_perc": "kvUsage",
};
const SGLANG: Record<string, Field> = {
  "sglang:num_running_reqs": "running",
  "sglang:num_queue_reqs": "waiting",
  "sglang:token_usage": "kvUsage",
  "sglang:num_prefill_prealloc_queue_reqs": "backlog",
  "sglang:num_prefill_bootstrap_queue_reqs": "backlog",
  "sglang:num_prefill_inflight_queue_reqs": "backlog",
  "sglang:num_decode_prealloc_queue_reqs": "backlog",
  "sglang:num_decode_transfer_queue_reqs": "backlog",
};
const ATOM: Record<string, Field> = {
  "atom:requests_running": "running",
  "atom:requests_waiting": "waiting",
  "atom:kv_cache_usage_ratio": "kvUsage",
  "atom:requests_parked_kv_load": "backlog",
};

/** The gauge names an engine kind exports. */
export const ENGINE_GAUGES: Readonly<Record<EngineKind, Readonly<Record<string, Field>>>> = {
  vllm: VLLM,
  sim: VLLM,
  sglang: SGLANG,
  atom: ATOM,
};

/** Every engine's names: only for callers that do not know the engine. */
const ANY: Record<string, Field> = { ...VLLM, ...SGLANG, ...ATOM };

/**
 * Parses Prometheus text exposition into an EngineLoad with `engine`'s gauge names (all known
 * names when no engine is given); null when none of them is present. PD backlog counts into
 * `waiting` and is also given alone as `pdBacklog`.
 */
export function parseEngineLoad(text: string, now = Date.now(), engine?: EngineKind): EngineLoad | null {
  const names = engine ? (ENGINE_GAUGES[engine] ?? ANY) : ANY;
  let running = 0;
  let waiting = 0;
  let backlog = 0;
  let kvSum = 0;
  let kvCount = 0;
  let seen = false;
  let seenBacklog = false;
  const seenKv = new Set<string>();
  for (const line of text.split("\n")) {
    if (line.length === 0 || line.charCodeAt(0) === 35 /* # */) continue;
    const brace = line.indexOf("{");
    const space = line.indexOf(" ");
    const nameEnd = brace >= 0 && brace < space ? brace : space;
    if (nameEnd <= 0) continue;
    const field = names[line.slice(0, nameEnd)];
    if (!field) continue;
    const valueStart = brace >= 0 && brace < space ? line.indexOf("}", brace) + 1 : space;
    const value = Number.parseFloat(line.slice(valueStart).trim().split(" ")[0] ?? "");
    if (!Number.isFinite(value)) continue;
    seen = true;
    if (field === "running") running += value;
    else if (field === "waiting") waiting += value;
    else if (field === "backlog") {
      backlog += value;
      seenBacklog = true;
    } else {
      // vLLM exports both the old and new KV-usage names in some versions: count one per label set.
      const labels = line.slice(nameEnd, valueStart);
      if (seenKv.has(labels)) continue;
      seenKv.add(labels);
      kvSum += value;
      kvCount++;
    }
  }
  if (!seen) return null;
  const load: EngineLoad = {
    running,
    waiting: waiting + backlog,
    kvUsage: kvCount > 0 ? kvSum / kvCount : 0,
    scrapedAt: now,
  };
  if (seenBacklog) load.pdBacklog = backlog;
  return load;
}

export class LoadScraper {
  private readonly workers: WorkerSet;
  private readonly intervalMs: number;
  private timer: NodeJS.Timeout | null = null;
  private readonly busy = new Set<LiveWorker>();
  /** Called after each round of scrapes (flow control re-checks headroom then). */
  onScraped: (() => void) | null = null;

  constructor(workers: WorkerSet, intervalMs: number) {
    this.workers = workers;
    this.intervalMs = intervalMs;
  }

  start(): void {
    if (this.intervalMs <= 0 || this.timer) return;
    this.timer = setInterval(() => void this.scrapeAll(), this.intervalMs);
    this.timer.unref();
    void this.scrapeAll();
  }

  async scrapeAll(): Promise<void> {
    await Promise.all(this.workers.list().map((w) => this.scrape(w)));
    this.onScraped?.();
  }

  private async scrape(w: LiveWorker): Promise<void> {
    if (this.busy.has(w)) return;
    this.busy.add(w);
    const timeout = Math.max(250, Math.min(this.intervalMs || 2000, 2000));
    try {
      const res = await request(`${w.record.url}/metrics`, {
        method: "GET",
        headersTimeout: timeout,
        bodyTimeout: timeout,
        signal: AbortSignal.timeout(timeout),
      });
      if (res.statusCode !== 200) {
        await res.body.dump();
        return;
      }
      const load = parseEngineLoad(await res.body.text(), Date.now(), w.record.engine);
      if (load) w.engineLoad = load;
    } catch {
      // Unreachable or slow: keep the last load; the breaker handles dead workers.
    } finally {
      this.busy.delete(w);
    }
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}
