/**
 * The NATS event plane's counterpart of src/kv/ingest.ts (KvIngest): follows a DiscoveryWatcher
 * and keeps one NatsKvSubscriber per worker with KV events, on `infera.kv.<model>.<worker>`
 * (the worker's agent relays there), all feeding one shared KvIndex. Same options and methods
 * as KvIngest, so the server picks one or the other by `--event-plane`.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { Registry } from "prom-client";
import type { DiscoveryEvent, DiscoveryWatcher, WorkerRecord } from "../../discovery/types.ts";
import { decodeBatch, isDecodeError } from "../../kv/events.ts";
import { KvIndex } from "../../kv/index.ts";
import { KvIngestMetrics } from "../../kv/metrics.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import { NatsKvSubscriber } from "./kv-subscriber.ts";
import { kvSubject } from "./subjects.ts";

export interface NatsKvIngestOptions {
  nc: NatsConnection;
  watcher: DiscoveryWatcher;
  index?: KvIndex;
  logger?: Logger;
  registry?: Registry;
  /** Only workers of this model (any model when absent). */
  model?: string;
  replayTimeoutMs?: number;
}

/** The subject a worker's agent relays its KV events to. */
export function workerKvSubject(rec: Pick<WorkerRecord, "model" | "id">): string {
  return kvSubject(rec.model, rec.id);
}

export class NatsKvIngest {
  readonly index: KvIndex;
  readonly metrics: KvIngestMetrics;
  private readonly logger: Logger;
  private readonly subs = new Map<string, { key: string; sub: NatsKvSubscriber; started: Promise<void> }>();
  private unsubscribe: (() => void) | null = null;

  constructor(private readonly opts: NatsKvIngestOptions) {
    this.index = opts.index ?? new KvIndex();
    this.logger = opts.logger ?? createLogger("kv-ingest-nats");
    this.metrics = new KvIngestMetrics(opts.registry ?? new Registry());
  }

  start(): void {
    if (this.unsubscribe) return;
    this.unsubscribe = this.opts.watcher.onChange((ev) => this.onChange(ev));
    this.reconcile();
  }

  /** Resolves when every current subscriber has applied its start-up replay. */
  async synced(): Promise<void> {
    await Promise.all([...this.subs.values()].map((s) => s.started));
  }

  tracks(workerId: string): boolean {
    return this.subs.has(workerId);
  }

  subscriber(workerId: string): NatsKvSubscriber | undefined {
    return this.subs.get(workerId)?.sub;
  }

  async close(): Promise<void> {
    this.unsubscribe?.();
    this.unsubscribe = null;
    for (const s of this.subs.values()) s.sub.close();
    this.subs.clear();
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
    if (!rec.kvEvents) {
      if (this.subs.has(rec.id)) this.drop(rec.id);
      return;
    }
    const subject = workerKvSubject(rec);
    const key = `${subject}|${rec.blockSize}`;
    const cur = this.subs.get(rec.id);
    if (cur && cur.key === key) return;
    if (cur) this.drop(rec.id);
    const { index, metrics } = this;
    const workerId = rec.id;
    const blockSize = rec.blockSize;
    index.addWorker(workerId, blockSize);
    const sub = new NatsKvSubscriber({
      nc: this.opts.nc,
      subject,
      replayTimeoutMs: this.opts.replayTimeoutMs,
      logger: this.logger,
      sink: {
        onBatch: (_seq, payload) => {
          const batch = decodeBatch(payload);
          if (isDecodeError(batch)) {
            metrics.malformed.inc({ worker: workerId });
            return;
          }
          index.applyEvents(workerId, batch.events, blockSize);
          metrics.batches.inc({ worker: workerId });
          for (const ev of batch.events) metrics.events.inc({ type: ev.type });
        },
        onReset: (reason) => {
          index.clearWorker(workerId);
          metrics.resets.inc({ reason: reason.includes("restart") ? "restart" : "gap" });
        },
      },
    });
    const started = sub.start().catch((err: Error) => {
      this.logger.warn({ worker: workerId, err: err.message }, "kv events over NATS: start failed");
    });
    this.subs.set(workerId, { key, sub, started });
    this.metrics.workers.set(this.subs.size);
    this.logger.info({ worker: workerId, subject }, "kv events: subscribed over NATS");
  }

  private drop(id: string): void {
    const cur = this.subs.get(id);
    this.index.removeWorker(id);
    if (!cur) return;
    this.subs.delete(id);
    this.metrics.workers.set(this.subs.size);
    cur.sub.close();
  }
}

export function startNatsKvIngest(opts: NatsKvIngestOptions): NatsKvIngest {
  const ingest = new NatsKvIngest(opts);
  ingest.start();
  return ingest;
}
