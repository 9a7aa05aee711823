/**
 * Follows a DiscoveryWatcher and keeps, per worker that publishes KV events (record.kvEvents),
 * one KvSubscriber per data-parallel rank (`kvEvents.ranks`, each with its own sequence numbers
 * and replay socket; the single endpoint when absent), all feeding one shared KvIndex. A worker
 * that leaves the registry has its subscribers closed and its entries dropped; a changed
 * endpoint restarts them.
 */
import { Registry } from "prom-client";
import type { DiscoveryWatcher, WorkerRecord } from "../discovery/types.ts";
import { createLogger, type Logger } from "../util/log.ts";
import { KvIndex } from "./index.ts";
import { KvIngestMetrics } from "./metrics.ts";
import type { KvSyncReport } from "./prefix-index.ts";
import { KvSubscriber, type KvZmqReader } from "./subscriber.ts";
import { rankSockets, WorkerFeeds } from "./worker-feeds.ts";

export { rankSockets };

export interface KvIngestOptions {
  watcher: DiscoveryWatcher;
  index?: KvIndex;
  logger?: Logger;
  /** The server's prom-client Registry; a private one when absent. */
  registry?: Registry;
  /** Only workers of this model (any model when absent). */
  model?: string;
  replayTimeoutMs?: number;
  /** Index cap per rank when a record has no `kvBlocks` (only when `index` is not given). */
  maxBlocksPerWorker?: number;
  /** How SUB sockets are read (KvSubscriberOptions.reader; default native where it loads). */
  zmqReader?: KvZmqReader;
}

function feedKey(rec: WorkerRecord): string | null {
  const e = rec.kvEvents;
  if (!e) return null;
  const ranks = rankSockets(rec)
    .map((r) => `${r.dpRank}@${r.endpoint}|${r.replayEndpoint ?? ""}`)
    .join(",");
  return `${ranks}|${e.topic}|${e.framing}|${rec.blockSize}|${rec.kvBlocks ?? ""}`;
}

export class KvIngest {
  private readonly opts: KvIngestOptions;
  readonly index: KvIndex;
  readonly metrics: KvIngestMetrics;
  private readonly logger: Logger;
  private readonly feeds: WorkerFeeds<KvSubscriber[]>;

  constructor(opts: KvIngestOptions) {
    this.opts = opts;
    this.index = opts.index ?? new KvIndex({ defaultMaxBlocks: opts.maxBlocksPerWorker });
    this.logger = opts.logger ?? createLogger("kv-ingest");
    this.metrics = new KvIngestMetrics(opts.registry ?? new Registry());
    const capped = this.metrics.capped;
    this.index.onCapped = (worker, n) => capped.inc({ worker }, n);
    this.feeds = new WorkerFeeds({
      watcher: opts.watcher,
      model: opts.model,
      keyOf: feedKey,
      open: (rec) => this.open(rec),
      close: async (subs) => {
        await Promise.all(subs.map((s) => s.close()));
      },
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
    await Promise.all(this.feeds.all().flatMap((subs) => subs.map((s) => s.synced)));
  }

  /** Every rank's sync state, with counts per state (GET /ready, /dashboard/state). */
  syncReport(): KvSyncReport {
    const report: KvSyncReport = { synced: 0, syncing: 0, unknown: 0, ranks: [] };
    for (const subs of this.feeds.all())
      for (const s of subs) {
        report[s.sync]++;
        report.ranks.push({
          worker: s.workerId,
          rank: s.dpRank,
          state: s.sync,
          syncMs: s.stats.syncMs >= 0 ? Math.round(s.stats.syncMs) : null,
        });
      }
    return report;
  }

  /** The worker's lowest rank's subscriber. */
  subscriber(workerId: string): KvSubscriber | undefined {
    return this.feeds.get(workerId)?.[0];
  }

  /** One subscriber per rank of the worker. */
  subscribers(workerId: string): readonly KvSubscriber[] {
    return this.feeds.get(workerId) ?? [];
  }

  /** True when the worker's KV events are being ingested. */
  tracks(workerId: string): boolean {
    return this.feeds.has(workerId);
  }

  async close(): Promise<void> {
    await this.feeds.close();
  }

  private open(rec: WorkerRecord): KvSubscriber[] {
    // keyOf returned a key, so the record has kvEvents.
    const events = rec.kvEvents as NonNullable<WorkerRecord["kvEvents"]>;
    const ranks = [...rankSockets(rec)].sort((a, b) => a.dpRank - b.dpRank);
    return ranks.map((r) => {
      const sub = new KvSubscriber({
        workerId: rec.id,
        events: { ...events, endpoint: r.endpoint, replayEndpoint: r.replayEndpoint, ranks: undefined },
        dpRank: r.dpRank,
        kvBlocks: rec.kvBlocks,
        blockSize: rec.blockSize,
        index: this.index,
        logger: this.logger,
        metrics: this.metrics,
        replayTimeoutMs: this.opts.replayTimeoutMs,
        reader: this.opts.zmqReader,
      });
      sub.start();
      this.logger.info({ worker: rec.id, rank: r.dpRank, endpoint: r.endpoint }, "kv events: subscribed");
      return sub;
    });
  }
}

export function startKvIngest(opts: KvIngestOptions): KvIngest {
  const ingest = new KvIngest(opts);
  ingest.start();
  return ingest;
}
