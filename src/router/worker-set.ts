/**
 * The server's live view of the fleet: one `LiveWorker` (a `WorkerState`) per discovered
 * worker, grouped per served model name, with in-flight accounting and a circuit breaker.
 *
 * Breaker: only connection errors and 5xx answers count against a worker (never 4xx). A
 * refused connection opens it at once (it is decisive); resets and 5xx answers open it
 * after `failureThreshold` in a row. Open = out of rotation; after a cooldown (doubling up
 * to `maxCooldownMs`) a half-open probe GETs `/health`; a 200 closes it.
 */
import { request } from "undici";
import type { DiscoveryEvent, DiscoveryWatcher, WorkerRecord, WorkerRole } from "../discovery/types.ts";
import type { Logger } from "../util/log.ts";
import { markStable } from "../util/stable-lists.ts";
import type { EngineLoad, WorkerState } from "./types.ts";

export type BreakerState = "closed" | "open" | "half-open";

export interface BreakerOptions {
  /** Consecutive 5xx answers that open the breaker. */
  failureThreshold: number;
  /** First wait before a half-open probe. */
  cooldownMs: number;
  maxCooldownMs: number;
  probeTimeoutMs: number;
}

export const defaultBreakerOptions: BreakerOptions = {
  failureThreshold: 3,
  cooldownMs: 500,
  maxCooldownMs: 10_000,
  probeTimeoutMs: 1000,
};

export class LiveWorker implements WorkerState {
  record: WorkerRecord;
  inFlight = 0;
  pendingPrefillTokens = 0;
  engineLoad?: EngineLoad;
  available = true;
  breaker: BreakerState = "closed";
  consecutiveFailures = 0;
  /** Requests this server sent to the worker (lifetime). */
  routed = 0;
  cooldownMs = 0;
  probeTimer: NodeJS.Timeout | null = null;

  constructor(record: WorkerRecord) {
    this.record = record;
  }

  get id(): string {
    return this.record.id;
  }
}

/** Workers serving one model name, pre-filtered so the hot path allocates nothing. */
export interface ModelGroup {
  readonly name: string;
  readonly all: readonly LiveWorker[];
  readonly available: readonly LiveWorker[];
  readonly availableByRole: Readonly<Record<WorkerRole, readonly LiveWorker[]>>;
  /** Bumped whenever membership (not availability) of the group changes. */
  readonly generation: number;
}

export type HealthProbe = (worker: LiveWorker, timeoutMs: number) => Promise<boolean>;

export const httpHealthProbe: HealthProbe = async (worker, timeoutMs) => {
  try {
    const res = await request(`${worker.record.url}/health`, {
      method: "GET",
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
      signal: AbortSignal.timeout(timeoutMs),
    });
    await res.body.dump();
    return res.statusCode === 200;
  } catch {
    return false;
  }
};

export interface WorkerSetOptions {
  logger: Logger;
  breaker?: Partial<BreakerOptions>;
  probe?: HealthProbe;
}

export type WorkerSetEvent =
  | { type: "added" | "updated" | "removed" | "available" | "unavailable"; worker: LiveWorker }
  | { type: "degraded"; reason: string }
  | { type: "restored" };

export class WorkerSet {
  private readonly discovery: DiscoveryWatcher;
  private readonly workers = new Map<string, LiveWorker>();
  private groups = new Map<string, ModelGroup>();
  private readonly generations = new Map<string, number>();
  private readonly listeners = new Set<(ev: WorkerSetEvent) => void>();
  private readonly breakerOpts: BreakerOptions;
  private readonly probe: HealthProbe;
  private readonly log: Logger;
  private unsubscribe: (() => void) | null = null;
  private closed = false;
  degraded = false;

  constructor(discovery: DiscoveryWatcher, opts: WorkerSetOptions) {
    this.discovery = discovery;
    this.log = opts.logger;
    this.breakerOpts = { ...defaultBreakerOptions, ...opts.breaker };
    this.probe = opts.probe ?? httpHealthProbe;
  }

  /** Subscribes to discovery, then loads its current set (the watcher must be started). */
  attach(): void {
    this.unsubscribe = this.discovery.onChange((ev) => this.onDiscovery(ev));
    // A backend may have started degraded (etcd down at start-up) before we subscribed.
    this.degraded = this.discovery.isDegraded?.() ?? false;
    for (const rec of this.discovery.workers()) this.upsert(rec);
  }

  list(): readonly LiveWorker[] {
    return [...this.workers.values()];
  }

  get(id: string): LiveWorker | undefined {
    return this.workers.get(id);
  }

  get size(): number {
    return this.workers.size;
  }

  group(modelName: string): ModelGroup | undefined {
    return this.groups.get(modelName);
  }

  modelNames(): string[] {
    return [...this.groups.keys()];
  }

  onChange(listener: (ev: WorkerSetEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** A request to the worker got a usable answer. */
  reportSuccess(w: LiveWorker): void {
    w.consecutiveFailures = 0;
  }

  /**
   * Counts a failure against the worker: `connect` (refused/unreachable) opens the breaker at
   * once; `reset` (dropped connection) and `5xx` open it after `failureThreshold` in a row.
   */
  reportFailure(w: LiveWorker, kind: "connect" | "reset" | "5xx"): void {
    w.consecutiveFailures++;
    if (w.breaker !== "closed") return;
    if (kind === "connect" || w.consecutiveFailures >= this.breakerOpts.failureThreshold) this.open(w, kind);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.unsubscribe?.();
    for (const w of this.workers.values()) this.clearProbe(w);
  }

  private open(w: LiveWorker, reason: string): void {
    w.breaker = "open";
    w.cooldownMs = w.cooldownMs
      ? Math.min(w.cooldownMs * 2, this.breakerOpts.maxCooldownMs)
      : this.breakerOpts.cooldownMs;
    this.log.warn({ worker: w.id, url: w.record.url, reason, cooldownMs: w.cooldownMs }, "circuit open");
    this.setAvailable(w, false);
    this.scheduleProbe(w);
  }

  private scheduleProbe(w: LiveWorker): void {
    this.clearProbe(w);
    w.probeTimer = setTimeout(() => void this.runProbe(w), w.cooldownMs);
    w.probeTimer.unref();
  }

  private async runProbe(w: LiveWorker): Promise<void> {
    w.probeTimer = null;
    if (this.closed || this.workers.get(w.id) !== w) return;
    w.breaker = "half-open";
    const ok = await this.probe(w, this.breakerOpts.probeTimeoutMs);
    if (this.closed || this.workers.get(w.id) !== w) return;
    if (ok) {
      w.breaker = "closed";
      w.consecutiveFailures = 0;
      w.cooldownMs = 0;
      this.log.info({ worker: w.id }, "circuit closed");
      this.setAvailable(w, true);
    } else {
      w.breaker = "open";
      w.cooldownMs = Math.min(w.cooldownMs * 2, this.breakerOpts.maxCooldownMs);
      this.scheduleProbe(w);
    }
  }

  private clearProbe(w: LiveWorker): void {
    if (w.probeTimer) clearTimeout(w.probeTimer);
    w.probeTimer = null;
  }

  private setAvailable(w: LiveWorker, available: boolean): void {
    if (w.available === available) return;
    w.available = available;
    this.rebuild(false);
    this.emit({ type: available ? "available" : "unavailable", worker: w });
  }

  private onDiscovery(ev: DiscoveryEvent): void {
    switch (ev.type) {
      case "put":
        this.upsert(ev.worker);
        break;
      case "delete":
        this.remove(ev.id);
        break;
      case "degraded":
        this.degraded = true;
        this.emit(ev);
        break;
      case "restored":
        this.degraded = false;
        this.emit(ev);
        break;
    }
  }

  private upsert(rec: WorkerRecord): void {
    const existing = this.workers.get(rec.id);
    if (existing) {
      existing.record = rec;
      this.rebuild(true);
      this.emit({ type: "updated", worker: existing });
      return;
    }
    const w = new LiveWorker(rec);
    this.workers.set(rec.id, w);
    this.rebuild(true);
    this.log.info(
      { worker: rec.id, url: rec.url, models: rec.servedModelNames, role: rec.role },
      "worker added",
    );
    this.emit({ type: "added", worker: w });
  }

  private remove(id: string): void {
    const w = this.workers.get(id);
    if (!w) return;
    this.workers.delete(id);
    this.clearProbe(w);
    this.rebuild(true);
    this.log.info({ worker: id }, "worker removed");
    this.emit({ type: "removed", worker: w });
  }

  private rebuild(membership: boolean): void {
    const members = new Map<string, LiveWorker[]>();
    for (const w of this.workers.values()) {
      for (const name of w.record.servedModelNames) {
        let list = members.get(name);
        if (!list) {
          list = [];
          members.set(name, list);
        }
        list.push(w);
      }
    }
    const groups = new Map<string, ModelGroup>();
    for (const [name, all] of members) {
      let gen = this.generations.get(name) ?? 0;
      // Any membership change (including a record update that may change roles) makes the
      // AutoRouter re-decide; it is rare, so no finer tracking is worth it.
      if (membership) this.generations.set(name, ++gen);
      const available = all.filter((w) => w.available);
      // Never changed once handed out (a change builds new lists): routing keeps what it derives
      // from a candidate list by the list's identity (src/router/pipeline/util.ts candidateView).
      groups.set(name, {
        name,
        all: markStable(all),
        available: markStable(available),
        availableByRole: {
          mixed: markStable(available.filter((w) => w.record.role === "mixed")),
          prefill: markStable(available.filter((w) => w.record.role === "prefill")),
          decode: markStable(available.filter((w) => w.record.role === "decode")),
        },
        generation: gen,
      });
    }
    for (const name of this.groups.keys()) {
      if (!groups.has(name)) this.generations.set(name, (this.generations.get(name) ?? 0) + 1);
    }
    this.groups = groups;
  }

  private emit(ev: WorkerSetEvent): void {
    for (const l of this.listeners) {
      try {
        l(ev);
      } catch (err) {
        this.log.error({ err }, "worker-set listener failed");
      }
    }
  }
}
