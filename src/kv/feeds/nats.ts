/**
 * The NATS plane's feed of one worker rank: the index and sync rules for a sequenced batch
 * stream. The stream itself (subject, relay epoch, paged replay, in-order delivery) speaks NATS
 * and lives in src/transport/nats/kv-subscriber.ts; it is handed in as a factory, so nothing
 * here imports a transport. What the stream reports becomes the same rank state as on the ZMQ
 * plane (../rank-sync.ts): a lost history resets the rank and makes it `unknown` (an engine
 * restart, announced by a new relay epoch, starts it afresh instead), a start-up replay that
 * cannot give the whole history leaves it `unknown`, never a trusted empty view.
 */
import type { Logger } from "../../util/log.ts";
import { decodeBatch, isDecodeError } from "../events.ts";
import type { KvIndex } from "../index.ts";
import type { KvIngestMetrics } from "../metrics.ts";
import type { IndexSync } from "../prefix-index.ts";
import { RankSync } from "../rank-sync.ts";
import type { KvBatchSink, KvBatchStream, KvFeed } from "./types.ts";

export interface NatsKvFeedOptions<S extends KvBatchStream> {
  workerId: string;
  dpRank: number;
  /** The engine's pool size from the record (caps this rank in the index; rebuild rule). */
  kvBlocks?: number;
  blockSize: number;
  index: KvIndex;
  metrics: KvIngestMetrics;
  logger: Logger;
  /** Makes the rank's stream, delivering into the sink given. */
  stream(sink: KvBatchSink): S;
}

export class NatsKvFeed<S extends KvBatchStream> implements KvFeed {
  readonly workerId: string;
  readonly dpRank: number;
  readonly stream: S;
  readonly synced: Promise<void>;
  private readonly rs: RankSync;

  constructor(o: NatsKvFeedOptions<S>) {
    const { workerId, dpRank, index, metrics, blockSize } = o;
    this.workerId = workerId;
    this.dpRank = dpRank;
    const rs = new RankSync({ index, workerId, rank: dpRank, kvBlocks: o.kvBlocks });
    this.rs = rs;
    this.stream = o.stream({
      onBatch: (_seq, payload) => {
        const batch = decodeBatch(payload);
        if (isDecodeError(batch)) {
          metrics.malformed.inc({ worker: workerId });
          return;
        }
        rs.apply(batch, blockSize);
        metrics.applied(workerId, batch);
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
    });
    this.synced = this.stream
      .start()
      .catch((err: Error) => {
        o.logger.warn(
          { worker: workerId, rank: dpRank, err: err.message },
          "kv events over NATS: start failed",
        );
        rs.markHole();
      })
      .finally(() => rs.settle());
  }

  /** The stream's counters. */
  get stats(): S["stats"] {
    return this.stream.stats;
  }

  get sync(): IndexSync {
    return this.rs.state;
  }

  get syncMs(): number {
    return this.rs.syncMs;
  }

  close(): void {
    this.rs.close();
    this.stream.close();
  }
}
