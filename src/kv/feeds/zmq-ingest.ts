/**
 * The ZMQ plane's ingest (KvIngest): per worker that publishes KV events (record.kvEvents), one
 * ZmqKvFeed per data-parallel rank (`kvEvents.ranks`, each with its own sequence numbers and
 * replay socket; the single endpoint when absent), on the shared ingest (./ingest.ts). A
 * changed endpoint reopens the worker's feeds.
 */
import type { WorkerRecord } from "../../discovery/types.ts";
import { KvFeedIngest, type KvFeedSource } from "./ingest.ts";
import type { KvFeedOptions } from "./types.ts";
import { rankSockets } from "./worker-feeds.ts";
import { ZmqKvFeed } from "./zmq.ts";

/** KvIngest's options: the one KV ingest options type. */
export type KvIngestOptions = KvFeedOptions;

function feedKey(rec: WorkerRecord): string | null {
  const e = rec.kvEvents;
  if (!e) return null;
  const ranks = rankSockets(rec)
    .map((r) => `${r.dpRank}@${r.endpoint}|${r.replayEndpoint ?? ""}`)
    .join(",");
  return `${ranks}|${e.topic}|${e.framing}|${rec.blockSize}|${rec.kvBlocks ?? ""}`;
}

const zmqSource: KvFeedSource<ZmqKvFeed> = {
  name: "kv-ingest",
  keyOf: feedKey,
  open(rec, { index, metrics, logger, opts }) {
    // keyOf returned a key, so the record has kvEvents.
    const events = rec.kvEvents as NonNullable<WorkerRecord["kvEvents"]>;
    const ranks = [...rankSockets(rec)].sort((a, b) => a.dpRank - b.dpRank);
    return ranks.map((r) => {
      const feed = new ZmqKvFeed({
        workerId: rec.id,
        events: { ...events, endpoint: r.endpoint, replayEndpoint: r.replayEndpoint, ranks: undefined },
        dpRank: r.dpRank,
        kvBlocks: rec.kvBlocks,
        blockSize: rec.blockSize,
        index,
        logger,
        metrics,
        replayTimeoutMs: opts.replayTimeoutMs,
        reader: opts.zmqReader,
      });
      feed.start();
      logger.info({ worker: rec.id, rank: r.dpRank, endpoint: r.endpoint }, "kv events: subscribed");
      return feed;
    });
  },
};

/** The ZMQ plane's KV ingest: one ZmqKvFeed per worker rank into one KvIndex. */
export class KvIngest extends KvFeedIngest<ZmqKvFeed> {
  constructor(opts: KvIngestOptions) {
    super(opts, zmqSource);
  }
}
