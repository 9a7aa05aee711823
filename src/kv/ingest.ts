/**
 * Follows a DiscoveryWatcher and keeps one KvSubscriber per worker that publishes KV events
 * (record.kvEvents), all feeding one shared KvIndex. A worker that leaves the registry has its
 * subscriber closed and its entries dropped; a changed endpoint restarts its subscriber.
 */
import { Registry } from "prom-client";
import type { DiscoveryEvent, DiscoveryWatcher, WorkerRecord } from "../discovery/types.ts";
import { createLogger, type Logger } from "../util/log.ts";
import { KvIndex } from "./index.ts";
import { KvIngestMetrics } from "./metrics.ts";
import { KvSubscriber } from "./subscriber.ts";

export interface KvIngestOptions {
  watcher: DiscoveryWatcher;
  index?: KvIndex;
  logger?: Logger;
  /** The server's prom-client Registry; a private one when absent. */
  registry?: Registry;
  /** Only workers of this model (any model when absent). */
  model?: string;
  replayTimeoutMs?: number;
}

function feedKey(rec: WorkerRecord): string {
  const e = rec.kvEvents;
  return e ? `${e.endpoint}|${e.replayEndpoint ?? ""}|${e.topic}|${e.framing}|${rec.blockSize}` : "";
}

export class KvIngest {
  readonly index: KvIndex;
  readonly metrics: KvIngestMetrics;
  private readonly logger: Logger;
  private readonly subs = new Map<string, { key: string; sub: KvSubscriber }>();
  private unsubscribe: (() => void) | null = null;

  constructor(private readonly opts: KvIngestOptions) {
    this.index = opts.index ?? new KvIndex();
    this.logger = opts.logger ?? createLogger("kv-ingest");
    this.metrics = new KvIngestMetrics(opts.registry ?? new Registry());
  }

  /** Subscribes to every current worker and follows changes. The watcher must be started. */
  start(): void {
    if (this.unsubscribe) return;
    this.unsubscribe = this.opts.watcher.onChange((ev) => this.onChange(ev));
    this.reconcile();
  }

  /** Resolves when every current subscriber has finished its start-up replay. */
  async synced(): Promise<void> {
    await Promise.all([...this.subs.values()].map((s) => s.sub.synced));
  }

  subscriber(workerId: string): KvSubscriber | undefined {
    return this.subs.get(workerId)?.sub;
  }

  /** True when the worker's KV events are being ingested. */
  tracks(workerId: string): boolean {
    return this.subs.has(workerId);
  }

  async close(): Promise<void> {
    this.unsubscribe?.();
    this.unsubscribe = null;
    const all = [...this.subs.values()];
    this.subs.clear();
    await Promise.all(all.map((s) => s.sub.close()));
    this.metrics.workers.set(0);
  }

  private onChange(ev: DiscoveryEvent): void {
    if (ev.type === "put") this.upsert(ev.worker);
    else if (ev.type === "delete") this.drop(ev.id);
    else if (ev.type === "restored") this.reconcile();
  }

  private reconcile(): void {
    const live = new Set<string>();
    for (const rec of this.opts.watcher.workers()) {
      live.add(rec.id);
      this.upsert(rec);
    }
    for (const id of [...this.subs.keys()]) if (!live.has(id)) this.drop(id);
  }

  private upsert(rec: WorkerRecord): void {
    if (this.opts.model && rec.model !== this.opts.model) return;
    const key = feedKey(rec);
    const cur = this.subs.get(rec.id);
    if (cur && cur.key === key) return;
    if (cur) this.drop(rec.id);
    if (!rec.kvEvents) return;
    const sub = new KvSubscriber({
      workerId: rec.id,
      events: rec.kvEvents,
      blockSize: rec.blockSize,
      index: this.index,
      logger: this.logger,
      metrics: this.metrics,
      replayTimeoutMs: this.opts.replayTimeoutMs,
    });
    this.subs.set(rec.id, { key, sub });
    this.metrics.workers.set(this.subs.size);
    sub.start();
    this.logger.info({ worker: rec.id, endpoint: rec.kvEvents.endpoint }, "kv events: subscribed");
  }

  private drop(id: string): void {
    const cur = this.subs.get(id);
    this.index.removeWorker(id);
    if (!cur) return;
    this.subs.delete(id);
    this.metrics.workers.set(this.subs.size);
    void cur.sub.close();
  }
}

export function startKvIngest(opts: KvIngestOptions): KvIngest {
  const ingest = new KvIngest(opts);
  ingest.start();
  return ingest;
}
