/**
 * The NATS event plane's counterpart of src/kv/ingest.ts (KvIngest): follows a DiscoveryWatcher
 * and keeps one NatsKvSubscriber per worker with KV events, on `infera.kv.<model>.<worker>`
 * (the worker's agent relays there), all feeding one shared KvIndex. Same options and methods
 * as KvIngest, so the server picks one or the other by `--event-plane`.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { Registry } from "prom-client";
import type { DiscoveryWatcher, WorkerRecord } from "../../discovery/types.ts";
import { decodeBatch, isDecodeError } from "../../kv/events.ts";
import { KvIndex } from "../../kv/index.ts";
import { KvIngestMetrics } from "../../kv/metrics.ts";
import { WorkerFeeds } from "../../kv/worker-feeds.ts";
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

interface NatsFeed {
  sub: NatsKvSubscriber;
  started: Promise<void>;
}

export class NatsKvIngest {
  readonly index: KvIndex;
  readonly metrics: KvIngestMetrics;
  private readonly logger: Logger;
  private readonly feeds: WorkerFeeds<NatsFeed>;

  constructor(private readonly opts: NatsKvIngestOptions) {
    this.index = opts.index ?? new KvIndex();
    this.logger = opts.logger ?? createLogger("kv-ingest-nats");
    this.metrics = new KvIngestMetrics(opts.registry ?? new Registry());
    this.feeds = new WorkerFeeds({
      watcher: opts.watcher,
      model: opts.model,
      keyOf: (rec) => (rec.kvEvents ? `${workerKvSubject(rec)}|${rec.blockSize}` : null),
      open: (rec) => this.open(rec),
      close: (feed) => feed.sub.close(),
      removeWorker: (id) => this.index.removeWorker(id),
      count: (n) => this.metrics.workers.set(n),
    });
  }

  start(): void {
    this.feeds.start();
  }

  /** Resolves when every current subscriber has applied its start-up replay. */
  async synced(): Promise<void> {
    await Promise.all(this.feeds.all().map((f) => f.started));
  }

  tracks(workerId: string): boolean {
    return this.feeds.has(workerId);
  }

  subscriber(workerId: string): NatsKvSubscriber | undefined {
    return this.feeds.get(workerId)?.sub;
  }

  async close(): Promise<void> {
    await this.feeds.close();
  }

  private open(rec: WorkerRecord): NatsFeed {
    const subject = workerKvSubject(rec);
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
    this.logger.info({ worker: workerId, subject }, "kv events: subscribed over NATS");
    return { sub, started };
  }
}

export function startNatsKvIngest(opts: NatsKvIngestOptions): NatsKvIngest {
  const ingest = new NatsKvIngest(opts);
  ingest.start();
  return ingest;
}
