/**
 * The KV ingest both planes share: follows a DiscoveryWatcher (./worker-feeds.ts) and keeps,
 * per worker with KV events (record.kvEvents), one feed per data-parallel rank, all applying to
 * one shared KvIndex; counts, sync report (GET /ready, /dashboard/state) and close. What a
 * feed is and how it is opened comes from the plane: ZMQ (./zmq-ingest.ts, KvIngest) or NATS
 * (src/transport/nats/kv-ingest.ts, NatsKvIngest).
 */
import { Registry } from "prom-client";
import type { WorkerRecord } from "../../discovery/types.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import { KvIndex } from "../index.ts";
import { KvIngestMetrics } from "../metrics.ts";
import type { KvSyncReport } from "../prefix-index.ts";
import type { KvFeed, KvFeedOptions } from "./types.ts";
import { WorkerFeeds } from "./worker-feeds.ts";

/** What a plane supplies: its feeds' identity and how to open a worker's. */
export interface KvFeedSource<F extends KvFeed> {
  /** The logger's name when the options give none. */
  name: string;
  /** What identifies the worker's feeds; a changed key reopens them. null: no KV events. */
  keyOf(rec: WorkerRecord): string | null;
  /** Opens and starts one feed per rank of the worker, lowest rank first. */
  open(rec: WorkerRecord, ctx: KvFeedContext): F[];
}

export interface KvFeedContext {
  index: KvIndex;
  metrics: KvIngestMetrics;
  logger: Logger;
  opts: KvFeedOptions;
}

export class KvFeedIngest<F extends KvFeed> {
  readonly index: KvIndex;
  readonly metrics: KvIngestMetrics;
  protected readonly logger: Logger;
  private readonly feeds: WorkerFeeds<F[]>;

  constructor(opts: KvFeedOptions, source: KvFeedSource<F>) {
    this.index = opts.index ?? new KvIndex({ defaultMaxBlocks: opts.maxBlocksPerWorker });
    this.logger = opts.logger ?? createLogger(source.name);
    this.metrics = new KvIngestMetrics(opts.registry ?? new Registry());
    const capped = this.metrics.capped;
    this.index.onCapped = (worker, n) => capped.inc({ worker }, n);
    const ctx: KvFeedContext = { index: this.index, metrics: this.metrics, logger: this.logger, opts };
    this.feeds = new WorkerFeeds({
      watcher: opts.watcher,
      model: opts.model,
      keyOf: (rec) => source.keyOf(rec),
      open: (rec) => source.open(rec, ctx),
      close: async (feeds) => {
        await Promise.all(feeds.map((f) => f.close()));
      },
      removeWorker: (id) => this.index.removeWorker(id),
      count: (n) => this.metrics.workers.set(n),
    });
  }

  /** Opens the feeds of every current worker and follows changes. The watcher must be started. */
  start(): void {
    this.feeds.start();
  }

  /** Resolves when every current feed has finished its start-up replay. */
  async synced(): Promise<void> {
    await Promise.all(this.feeds.all().flatMap((feeds) => feeds.map((f) => f.synced)));
  }

  /** Every rank's sync state, with counts per state (GET /ready, /dashboard/state). */
  syncReport(): KvSyncReport {
    const report: KvSyncReport = { synced: 0, syncing: 0, unknown: 0, ranks: [] };
    for (const feeds of this.feeds.all())
      for (const f of feeds) {
        report[f.sync]++;
        report.ranks.push({
          worker: f.workerId,
          rank: f.dpRank,
          state: f.sync,
          syncMs: f.syncMs >= 0 ? Math.round(f.syncMs) : null,
        });
      }
    return report;
  }

  /** The worker's lowest rank's feed. */
  subscriber(workerId: string): F | undefined {
    return this.feeds.get(workerId)?.[0];
  }

  /** One feed per rank of the worker. */
  subscribers(workerId: string): readonly F[] {
    return this.feeds.get(workerId) ?? [];
  }

  /** True when the worker's KV events are being ingested. */
  tracks(workerId: string): boolean {
    return this.feeds.has(workerId);
  }

  async close(): Promise<void> {
    await this.feeds.close();
  }
}
