/**
 * The NATS event plane's KV ingest (NatsKvIngest): the shared ingest of src/kv/feeds/ingest.ts
 * with one NatsKvFeed (src/kv/feeds/nats.ts: the index and sync rules) per worker rank, each
 * over a NatsKvSubscriber (./kv-subscriber.ts: the NATS wire) on `infera.kv.<model>.<worker>`
 * (rank r of a worker listing `kvEvents.ranks`: `….dp<r>`, see kvRankSubject; the worker's
 * agent relays there). Same options (plus the connection) and methods as the ZMQ plane's
 * KvIngest, so the server picks one or the other by `--event-plane`.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import type { WorkerRecord } from "../../discovery/types.ts";
import { KvFeedIngest, type KvFeedSource } from "../../kv/feeds/ingest.ts";
import { NatsKvFeed } from "../../kv/feeds/nats.ts";
import type { KvFeedOptions } from "../../kv/feeds/types.ts";
import { rankSockets } from "../../kv/feeds/worker-feeds.ts";
import { NatsKvSubscriber } from "./kv-subscriber.ts";
import { kvRankSubject } from "./kv-wire.ts";
import { kvSubject } from "./subjects.ts";

export interface NatsKvIngestOptions extends KvFeedOptions {
  nc: NatsConnection;
}

/** The subject a worker's agent relays its KV events to. */
export function workerKvSubject(rec: Pick<WorkerRecord, "model" | "id">): string {
  return kvSubject(rec.model, rec.id);
}

/** Each rank's subject: the worker's own when it lists no ranks. */
function rankSubjects(rec: WorkerRecord): { dpRank: number; subject: string }[] {
  const base = workerKvSubject(rec);
  if (!rec.kvEvents?.ranks?.length) return [{ dpRank: rankSockets(rec)[0]?.dpRank ?? 0, subject: base }];
  return [...rec.kvEvents.ranks]
    .sort((a, b) => a.dpRank - b.dpRank)
    .map((r) => ({ dpRank: r.dpRank, subject: kvRankSubject(base, r.dpRank) }));
}

export type NatsFeed = NatsKvFeed<NatsKvSubscriber>;

function natsSource(nc: NatsConnection): KvFeedSource<NatsFeed> {
  return {
    name: "kv-ingest-nats",
    keyOf: (rec) =>
      rec.kvEvents
        ? `${rankSubjects(rec)
            .map((r) => r.subject)
            .join(",")}|${rec.blockSize}|${rec.kvBlocks ?? ""}|${rec.natsKvEpoch ?? ""}`
        : null,
    open(rec, { index, metrics, logger, opts }) {
      index.addWorker(rec.id, rec.blockSize, 0, rec.kvBlocks);
      return rankSubjects(rec).map(({ dpRank, subject }) => {
        const feed = new NatsKvFeed({
          workerId: rec.id,
          dpRank,
          kvBlocks: rec.kvBlocks,
          blockSize: rec.blockSize,
          index,
          metrics,
          logger,
          stream: (sink) =>
            new NatsKvSubscriber({
              nc,
              subject,
              epoch: rec.natsKvEpoch,
              replayTimeoutMs: opts.replayTimeoutMs,
              logger,
              sink,
            }),
        });
        logger.info({ worker: rec.id, rank: dpRank, subject }, "kv events: subscribed over NATS");
        return feed;
      });
    },
  };
}

export class NatsKvIngest extends KvFeedIngest<NatsFeed> {
  constructor(opts: NatsKvIngestOptions) {
    super(opts, natsSource(opts.nc));
  }
}
