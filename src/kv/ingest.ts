/**
 * Follows a DiscoveryWatcher and keeps one KvSubscriber per worker that publishes KV events
 * (record.kvEvents), all feeding one shared KvIndex. A worker that leaves the registry has its
 * subscriber closed and its entries dropped; a changed endpoint restarts its subscriber.
 */
import { Registry } from "prom-client";
import type { DiscoveryWatcher, WorkerRecord } from "../discovery/types.ts";
import { createLogger, type Logger } from "../util/log.ts";
import { KvIndex } from "./index.ts";
import { KvIngestMetrics } from "./metrics.ts";
import { KvSubscriber } from "./subscriber.ts";
import { WorkerFeeds } from "./worker-feeds.ts";

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

function feedKey(rec: WorkerRecord): string | null {
  const e = rec.kvEvents;
  return e ? `${e.endpoint}|${e.replayEndpoint ?? ""}|${e.topic}|${e.framing}|${rec.blockSize}` : null;
}

export class KvIngest {
  readonly index: KvIndex;
  readonly metrics: KvIngestMetrics;
  private readonly logger: Logger;
  private readonly feeds: WorkerFeeds<KvSubscriber>;

  constructor(private readonly opts: KvIngestOptions) {
    this.index = opts.index ?? new KvIndex();
    this.logger = opts.logger ?? createLogger("kv-ingest");
    this.metrics = new KvIngestMetrics(opts.registry ?? new Registry());
    this.feeds = new WorkerFeeds({
      watcher: opts.watcher,
      model: opts.model,
      keyOf: feedKey,
      open: (rec) => this.open(rec),
      close: (sub) => sub.close(),
      removeWorker: (id) => this.index.removeWorker(id),
      count: (n) => this.metrics.workers.set(n),
    });
  }

  /** Subscribes to every current worker and follows changes. The watcher must be started. */
  start(): void {
    this.feeds.start();
  }

  /** Resolves when every current subscriber has finished its start-up replay. */
  async synced(): Promise<void> {
    await Promise.all(this.feeds.all().map((sub) => sub.synced));
  }

  subscriber(workerId: string): KvSubscriber | undefined {
    return this.feeds.get(workerId);
  }

  /** True when the worker's KV events are being ingested. */
  tracks(workerId: string): boolean {
    return this.feeds.has(workerId);
  }

  async close(): Promise<void> {
    await this.feeds.close();
  }

  private open(rec: WorkerRecord): KvSubscriber {
    // keyOf returned a key, so the record has kvEvents.
    const events = rec.kvEvents as NonNullable<WorkerRecord["kvEvents"]>;
    const sub = new KvSubscriber({
      workerId: rec.id,
      events,
      blockSize: rec.blockSize,
      index: this.index,
      logger: this.logger,
      metrics: this.metrics,
      replayTimeoutMs: this.opts.replayTimeoutMs,
    });
    sub.start();
    this.logger.info({ worker: rec.id, endpoint: events.endpoint }, "kv events: subscribed");
    return sub;
  }
}

export function startKvIngest(opts: KvIngestOptions): KvIngest {
  const ingest = new KvIngest(opts);
  ingest.start();
  return ingest;
}
