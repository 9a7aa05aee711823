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
import { type Dispatcher, request } from "undici";
import type { EngineKind } from "../discovery/types.ts";
import type { ScrapedReading, SharedLoad } from "../router/peers/types.ts";
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

/**
 * Scrapes each worker on its own schedule: every `intervalMs` while it is busy or changing, every
 * `idleIntervalMs` once it is seen idle — nothing running or waiting, nothing in flight from this
 * server, and the same load as the scrape before. A request this server sends there makes it
 * busy at once (its `inFlight`), so the next tick scrapes it at the fast pace again. An idle
 * fleet of N workers then costs N / idleIntervalMs scrapes per second instead of N / intervalMs,
 * on this server and on the engines, per replica. One timer ticks every `intervalMs` and scrapes
 * only the workers that are due (within half a tick, so timer drift does not skip one).
 *
 * Caveat: traffic that other replicas send to an idle worker shows at its next slow scrape (at
 * most `idleIntervalMs` late); from then on it is scraped at the fast pace while it stays busy.
 *
 * Shared among replicas (`shareWith`, src/router/peers/load-share.ts): each worker is scraped
 * only by its owner among the live replicas, which reports its readings; the others file them
 * as the worker's `engineLoad` and tell the owner which workers they have requests in flight on
 * (it scrapes those at the busy pace; the caveat above then does not apply). A worker whose
 * owner's readings stop — `busyQuietMs` while this replica has requests there, `idleQuietMs`
 * otherwise (past the owner's slowest pace) — is scraped here until they come again; an owner
 * gone from the live set is replaced by the hash at once.
 */
export class LoadScraper {
  private readonly workers: WorkerSet;
  private readonly intervalMs: number;
  private readonly idleIntervalMs: number;
  private timer: NodeJS.Timeout | null = null;
  private readonly busy = new Set<LiveWorker>();
  /** When each worker is next due (ms since the epoch), and whether it was idle last time. */
  private readonly due = new WeakMap<LiveWorker, number>();
  /** Scrapes started (for tests and the bench). */
  scrapes = 0;
  /** Peers' readings filed instead of a scrape. */
  peerReadings = 0;
  /** Called after each round of scrapes and each peer's report (flow control re-checks headroom then). */
  onScraped: (() => void) | null = null;
  private share: SharedLoad | null = null;
  /** Readings scraped here and not yet reported to peers. */
  private outbox: ScrapedReading[] = [];
  /** Per worker a peer scrapes: when its last reading came, or when this replica left it to the peer. */
  private readonly heardAt = new WeakMap<LiveWorker, number>();
  /** Per worker with requests in flight from here: since when (the quiet clock starts then). */
  private readonly busySince = new WeakMap<LiveWorker, number>();

  /**
   * The connection pool to scrape a worker URL through (the request plane's, see
   * HttpExecutor.dispatcherFor); undici's global dispatcher when absent or undefined.
   */
  private readonly dispatcherFor: ((url: string) => Dispatcher | undefined) | undefined;

  constructor(
    workers: WorkerSet,
    intervalMs: number,
    idleIntervalMs = 0,
    dispatcherFor?: (url: string) => Dispatcher | undefined,
  ) {
    this.workers = workers;
    this.dispatcherFor = dispatcherFor;
    this.intervalMs = intervalMs;
    this.idleIntervalMs = Math.max(idleIntervalMs, intervalMs);
  }

  /** Shares the scrapes with peer replicas (src/router/peers/load-share.ts); before `start`. */
  shareWith(share: SharedLoad): void {
    this.share = share;
    share.onReadings = (rs) => this.file(rs);
  }

  /** Replicas sharing the scrape, this one included (null: no peer plane shares it). */
  liveReplicas(): number | null {
    return this.share ? this.share.liveCount() : null;
  }

  /** A peer owns a worker busy here: its readings count as stopped after this long without one. */
  get busyQuietMs(): number {
    return 3 * this.intervalMs;
  }

  /** … and for a worker idle here: past the owner's slowest pace (its idle interval, jittered). */
  get idleQuietMs(): number {
    return 1.25 * this.idleIntervalMs + 2 * this.intervalMs;
  }

  start(): void {
    if (this.intervalMs <= 0 || this.timer) return;
    this.timer = setInterval(() => this.tick(), this.intervalMs);
    this.timer.unref();
    void this.scrapeAll();
  }

  /** Scrapes every worker now, whatever its schedule. */
  async scrapeAll(): Promise<void> {
    await Promise.all(this.workers.list().map((w) => this.scrape(w)));
    this.onScraped?.();
  }

  /**
   * Scrapes the workers that are due, or busy now (a request went there since, here or at a
   * peer), among those this replica scrapes; with peers, reports (the heartbeat, the busy
   * hints) now and the round's readings when it is over.
   */
  private tick(): void {
    const now = Date.now();
    const share = this.share;
    const round: Promise<void>[] = [];
    const busyHere: string[] = [];
    for (const w of this.workers.list()) {
      if (w.inFlight > 0) {
        if (!this.busySince.has(w)) this.busySince.set(w, now);
      } else this.busySince.delete(w);
      if (share && !this.scrapesHere(w, share, now)) {
        if (w.inFlight > 0) busyHere.push(w.record.id);
        continue;
      }
      const at = this.due.get(w);
      const busy = w.inFlight > 0 || (share?.busyElsewhere(w.record.id) ?? false);
      if (at === undefined || at <= now + this.intervalMs / 2 || busy) round.push(this.scrape(w));
    }
    if (share) this.flush(share, busyHere);
    // Flow control's queue waits for this: without it a queued request whose headroom came
    // back by a reading (or by time: load's higherActiveMs) waited for the next completion.
    // With peers, the round's readings go to them then too.
    if (round.length > 0)
      void Promise.all(round).then(() => {
        if (share && this.outbox.length > 0) this.flush(share, []);
        this.onScraped?.();
      });
  }

  /** Whether this replica scrapes `w`: it owns it, or its owner's readings stopped. */
  private scrapesHere(w: LiveWorker, share: SharedLoad, now: number): boolean {
    if (share.isMine(w.record.id)) {
      this.heardAt.delete(w);
      return true;
    }
    const heard = this.heardAt.get(w);
    if (heard === undefined) {
      this.heardAt.set(w, now);
      return false;
    }
    const busy = this.busySince.get(w);
    if (busy !== undefined) return now - Math.max(heard, busy) > this.busyQuietMs;
    return now - heard > this.idleQuietMs;
  }

  private flush(share: SharedLoad, busy: readonly string[]): void {
    const readings = this.outbox;
    this.outbox = [];
    share.report(readings, busy, this.intervalMs);
  }

  /** Peers' readings: each newer than what this replica holds becomes the worker's load. */
  private file(readings: readonly ScrapedReading[]): void {
    const now = Date.now();
    for (const r of readings) {
      const w = this.workers.get(r.worker);
      if (!w) continue;
      this.heardAt.set(w, now);
      if (w.engineLoad && w.engineLoad.scrapedAt >= r.scrapedAt) continue;
      const load: EngineLoad = {
        running: r.running,
        waiting: r.waiting,
        kvUsage: r.kvUsage,
        scrapedAt: r.scrapedAt,
      };
      if (r.pdBacklog !== undefined) load.pdBacklog = r.pdBacklog;
      w.engineLoad = load;
      this.peerReadings++;
    }
    this.onScraped?.();
  }

  private async scrape(w: LiveWorker): Promise<void> {
    if (this.busy.has(w)) return;
    this.busy.add(w);
    this.scrapes++;
    const timeout = Math.max(250, Math.min(this.intervalMs || 2000, 2000));
    const before = w.engineLoad;
    try {
      const res = await request(`${w.record.url}/metrics`, {
        dispatcher: this.dispatcherFor?.(w.record.url),
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
      if (load) {
        w.engineLoad = load;
        if (this.share) this.outbox.push({ worker: w.record.id, ...load });
      }
    } catch {
      // Unreachable or slow: keep the last load; the breaker handles dead workers.
    } finally {
      this.busy.delete(w);
      // Idle paces are jittered (±25 %): workers scraped together at start-up would otherwise
      // stay in step and come due all at once, a burst every idle interval.
      const idle = isIdle(w, before) && !this.share?.busyElsewhere(w.record.id);
      this.due.set(
        w,
        Date.now() + (idle ? this.idleIntervalMs * (0.75 + 0.5 * Math.random()) : this.intervalMs),
      );
    }
  }

  stop(): void {
    if (this.timer) {
      clearInterval(this.timer);
      // Peers take this replica's workers over now, not after its live window.
      this.share?.leave();
    }
    this.timer = null;
  }
}

/** Nothing runs or waits there, this server sends it nothing, and the load is as it was. */
function isIdle(w: LiveWorker, before: EngineLoad | undefined): boolean {
  const l = w.engineLoad;
  if (!l || !before || w.inFlight > 0) return false;
  return (
    l.running === 0 &&
    l.waiting === 0 &&
    before.running === 0 &&
    before.waiting === 0 &&
    l.kvUsage === before.kvUsage
  );
}
