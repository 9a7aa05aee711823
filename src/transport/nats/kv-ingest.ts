/**
 * The NATS event plane's counterpart of src/kv/ingest.ts (KvIngest): follows a DiscoveryWatcher
 * and keeps one NatsKvSubscriber per worker with KV events and DP rank, on
 * `infera.kv.<model>.<worker>` (rank r of a worker listing `kvEvents.ranks`: `….dp<r>`, see
 * kvRankSubject; the worker's agent relays there), all feeding one shared KvIndex per rank. Same options and methods
 * as KvIngest, so the server picks one or the other by `--event-plane`.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { Registry } from "prom-client";
import type { DiscoveryWatcher, WorkerRecord } from "../../discovery/types.ts";
import { decodeBatch, isDecodeError } from "../../kv/events.ts";
import { KvIndex } from "../../kv/index.ts";
import { KvIngestMetrics } from "../../kv/metrics.ts";
import type { KvSyncReport } from "../../kv/prefix-index.ts";
import { RankSync } from "../../kv/rank-sync.ts";
import { rankSockets, WorkerFeeds } from "../../kv/worker-feeds.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import { NatsKvSubscriber } from "./kv-subscriber.ts";
import { kvRankSubject } from "./kv-wire.ts";
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
  /** Index cap per rank when a record has no `kvBlocks` (only when `index` is not given). */
  maxBlocksPerWorker?: number;
}

/** The subject a worker's agent relays its KV events to. */
export function workerKvSubject(rec: Pick<WorkerRecord, "model" | "id">): string {
  return kvSubject(rec.model, rec.id);
}

interface NatsFeed {
  /** One per DP rank, lowest first. */
  subs: NatsKvSubscriber[];
  /** Each rank's index sync and DP rank, in the order of `subs`. */
  syncs: RankSync[];
  rankIds: number[];
  started: Promise<void>;
}

/** Each rank's subject: the worker's own when it lists no ranks. */
function rankSubjects(rec: WorkerRecord): { dpRank: number; subject: string }[] {
  const base = workerKvSubject(rec);
  if (!rec.kvEvents?.ranks?.length) return [{ dpRank: rankSockets(rec)[0]?.dpRank ?? 0, subject: base }];
  return [...rec.kvEvents.ranks]
    .sort((a, b) => a.dpRank - b.dpRank)
    .map((r) => ({ dpRank: r.dpRank, subject: kvRankSubject(base, r.dpRank) }));
}

export class NatsKvIngest {
  private readonly opts: NatsKvIngestOptions;
  readonly index: KvIndex;
  readonly metrics: KvIngestMetrics;
  private readonly logger: Logger;
  private readonly feeds: WorkerFeeds<NatsFeed>;

  constructor(opts: NatsKvIngestOptions) {
    this.opts = opts;
    this.index = opts.index ?? new KvIndex({ defaultMaxBlocks: opts.maxBlocksPerWorker });
    this.logger = opts.logger ?? createLogger("kv-ingest-nats");
    this.metrics = new KvIngestMetrics(opts.registry ?? new Registry());
    const capped = this.metrics.capped;
    this.index.onCapped = (worker, n) => capped.inc({ worker }, n);
    this.feeds = new WorkerFeeds({
      watcher: opts.watcher,
      model: opts.model,
      keyOf: (rec) =>
        rec.kvEvents
          ? `${rankSubjects(rec)
              .map((r) => r.subject)
              .join(",")}|${rec.blockSize}|${rec.kvBlocks ?? ""}|${rec.natsKvEpoch ?? ""}`
          : null,
      open: (rec) => this.open(rec),
      close: async (feed) => {
        for (const rs of feed.syncs) rs.close();
        await Promise.all(feed.subs.map((s) => s.close()));
      },
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

  /** Every rank's sync state, with counts per state (GET /ready, /dashboard/state). */
  syncReport(): KvSyncReport {
    const report: KvSyncReport = { synced: 0, syncing: 0, unknown: 0, ranks: [] };
    for (const [workerId, feed] of this.feeds.entries())
      feed.syncs.forEach((rs, i) => {
        report[rs.state]++;
        report.ranks.push({
          worker: workerId,
          rank: feed.rankIds[i],
          state: rs.state,
          syncMs: rs.syncMs >= 0 ? Math.round(rs.syncMs) : null,
        });
      });
    return report;
  }

  tracks(workerId: string): boolean {
    return this.feeds.has(workerId);
  }

  /** The worker's lowest rank's subscriber. */
  subscriber(workerId: string): NatsKvSubscriber | undefined {
    return this.feeds.get(workerId)?.subs[0];
  }

  subscribers(workerId: string): readonly NatsKvSubscriber[] {
    return this.feeds.get(workerId)?.subs ?? [];
  }

  async close(): Promise<void> {
    await this.feeds.close();
  }

  private open(rec: WorkerRecord): NatsFeed {
    const { index, metrics } = this;
    const workerId = rec.id;
    const blockSize = rec.blockSize;
    index.addWorker(workerId, blockSize, 0, rec.kvBlocks);
    const syncs: RankSync[] = [];
    const ranks = rankSubjects(rec);
    const subs = ranks.map(({ dpRank, subject }) => {
      // The same sync rules as the ZMQ plane: unknown (not empty) when history cannot be had.
      const rs = new RankSync({ index, workerId, rank: dpRank, kvBlocks: rec.kvBlocks });
      syncs.push(rs);
      const sub = new NatsKvSubscriber({
        nc: this.opts.nc,
        subject,
        epoch: rec.natsKvEpoch,
        replayTimeoutMs: this.opts.replayTimeoutMs,
        logger: this.logger,
        sink: {
          onBatch: (_seq, payload) => {
            const batch = decodeBatch(payload);
            if (isDecodeError(batch)) {
              metrics.malformed.inc({ worker: workerId });
              return;
            }
            rs.apply(batch, blockSize);
            metrics.batches.inc({ worker: workerId });
            for (const ev of batch.events) metrics.events.inc({ type: ev.type });
          },
          onRefused: (reason) => metrics.refused.inc({ worker: workerId, reason }),
          onReset: (reason) => {
            index.clearWorker(workerId, dpRank);
            metrics.resets.inc({ reason: reason.includes("restart") ? "restart" : "gap" });
            // An engine restart numbers from 0 again: the batch that follows is its first.
            if (reason.includes("restarted")) rs.clearHole();
            else rs.markHole();
          },
          onUnknown: () => rs.markHole(),
        },
      });
      this.logger.info({ worker: workerId, rank: dpRank, subject }, "kv events: subscribed over NATS");
      return sub;
    });
    const started = Promise.all(subs.map((s) => s.start()))
      .then(() => {})
      .catch((err: Error) => {
        this.logger.warn({ worker: workerId, err: err.message }, "kv events over NATS: start failed");
        for (const rs of syncs) rs.markHole();
      })
      .finally(() => {
        for (const rs of syncs) rs.settle();
      });
    return { subs, syncs, rankIds: ranks.map((r) => r.dpRank), started };
  }
}

export function startNatsKvIngest(opts: NatsKvIngestOptions): NatsKvIngest {
  const ingest = new NatsKvIngest(opts);
  ingest.start();
  return ingest;
}
