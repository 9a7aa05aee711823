/**
 * Periodic GET of each worker's `/metrics`, parsed into `WorkerState.engineLoad`. Knows the
 * vLLM, SGLang and ATOM gauge names (engine-protocols.md §2); sums over label sets (several
 * engines / dp ranks behind one URL). One scrape per worker at a time; failures are ignored
 * (the breaker, not the scraper, decides availability).
 */
import { request } from "undici";
import type { EngineLoad } from "../router/types.ts";
import type { LiveWorker, WorkerSet } from "../router/worker-set.ts";

type Field = "running" | "waiting" | "kvUsage";

const NAMES: Record<string, Field> = {
  "vllm:num_requests_running": "running",
  "vllm:num_requests_waiting": "waiting",
  "vllm:kv_cache_usage_perc": "kvUsage",
  "vllm:gpu_cache_usage_perc": "kvUsage",
  "sglang:num_running_reqs": "running",
  "sglang:num_queue_reqs": "waiting",
  "sglang:token_usage": "kvUsage",
  "atom:requests_running": "running",
  "atom:requests_waiting": "waiting",
  "atom:kv_cache_usage_ratio": "kvUsage",
};

/** Parses Prometheus text exposition into an EngineLoad; null when no known gauge is present. */
export function parseEngineLoad(text: string, now = Date.now()): EngineLoad | null {
  let running = 0;
  let waiting = 0;
  let kvSum = 0;
  let kvCount = 0;
  let seen = false;
  const seenKv = new Set<string>();
  for (const line of text.split("\n")) {
    if (line.length === 0 || line.charCodeAt(0) === 35 /* # */) continue;
    const brace = line.indexOf("{");
    const space = line.indexOf(" ");
    const nameEnd = brace >= 0 && brace < space ? brace : space;
    if (nameEnd <= 0) continue;
    const field = NAMES[line.slice(0, nameEnd)];
    if (!field) continue;
    const valueStart = brace >= 0 && brace < space ? line.indexOf("}", brace) + 1 : space;
    const value = Number.parseFloat(line.slice(valueStart).trim().split(" ")[0] ?? "");
    if (!Number.isFinite(value)) continue;
    seen = true;
    if (field === "running") running += value;
    else if (field === "waiting") waiting += value;
    else {
      // vLLM exports both the old and new KV-usage names in some versions: count one per label set.
      const labels = line.slice(nameEnd, valueStart);
      if (seenKv.has(labels)) continue;
      seenKv.add(labels);
      kvSum += value;
      kvCount++;
    }
  }
  if (!seen) return null;
  return { running, waiting, kvUsage: kvCount > 0 ? kvSum / kvCount : 0, scrapedAt: now };
}

export class LoadScraper {
  private timer: NodeJS.Timeout | null = null;
  private readonly busy = new Set<LiveWorker>();

  constructor(
    private readonly workers: WorkerSet,
    private readonly intervalMs: number,
  ) {}

  start(): void {
    if (this.intervalMs <= 0 || this.timer) return;
    this.timer = setInterval(() => void this.scrapeAll(), this.intervalMs);
    this.timer.unref();
    void this.scrapeAll();
  }

  async scrapeAll(): Promise<void> {
    await Promise.all(this.workers.list().map((w) => this.scrape(w)));
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
      const load = parseEngineLoad(await res.body.text());
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
