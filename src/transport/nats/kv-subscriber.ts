/**
 * Server side of the NATS KV-event plane, the wire: follows one worker rank's
 * `infera.kv.<model>.<worker>`, checks each batch's relay epoch (header `Infera-Kv-Epoch`), and
 * asks the worker's agent for replay pages (kv-wire.ts). The sequence rules (order, gaps,
 * duplicates, refused restarts, reset when history is gone) are src/kv/feeds/sequenced.ts's.
 * On start it replays the agent's buffer, so a new server replica builds its index from
 * history, not only from what arrives after it.
 */
import { createInbox, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { type ReplayPage, SequencedBatches, type SequencedStats } from "../../kv/feeds/sequenced.ts";
import type { KvBatchSink, KvBatchStream } from "../../kv/feeds/types.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import { decodeReplayEnd, encodeReplayRequest, KV_EPOCH_HEADER, kvPayload, readKvSeq } from "./kv-wire.ts";
import { kvReplaySubject } from "./subjects.ts";

export interface NatsKvSubscriberOptions {
  nc: NatsConnection;
  /** The worker's KV subject (`kvSubject(model, id)`). */
  subject: string;
  sink: KvBatchSink;
  /** Replay the agent's buffer on start (default true). */
  replayOnStart?: boolean;
  /**
   * The epoch the worker's record announces (`natsKvEpoch`): only batches stamped with it are
   * applied. Absent (an agent from before epochs): batches are not checked, but a sequence
   * restart is still refused.
   */
  epoch?: string;
  /** Batches asked per replay page (default 1000). */
  replayPage?: number;
  /** How long a replay page may go without a message (default 2000 ms): a stall timeout. */
  replayTimeoutMs?: number;
  logger?: Logger;
}

export type NatsKvSubscriberStats = SequencedStats;

export class NatsKvSubscriber implements KvBatchStream {
  private readonly o: NatsKvSubscriberOptions;
  private readonly seq: SequencedBatches;
  private live?: Subscription;
  private readonly replaySubject: string;

  constructor(o: NatsKvSubscriberOptions) {
    this.o = o;
    this.replaySubject = kvReplaySubject(o.subject);
    this.seq = new SequencedBatches({
      sink: o.sink,
      logger: o.logger ?? createLogger("nats-kv-sub", { subject: o.subject }),
      wire: { seqOf: readKvSeq, payloadOf: kvPayload, replayPage: (start) => this.replayPage(start) },
    });
  }

  get stats(): NatsKvSubscriberStats {
    return this.seq.stats;
  }

  /** Resolves after the initial replay (if any) is applied. */
  async start(): Promise<void> {
    this.live = this.o.nc.subscribe(this.o.subject, {
      callback: (err, msg) => {
        if (!err && this.epochOk(msg)) this.seq.onLive(msg.data);
      },
    });
    await this.o.nc.flush();
    if (this.o.replayOnStart ?? true) await this.seq.recover(0, true);
  }

  close(): void {
    this.seq.close();
    this.live?.unsubscribe();
  }

  /** The next sequence number this subscriber will deliver (null before any). */
  get nextSeq(): number | null {
    return this.seq.nextSeq;
  }

  /** The batch carries the record's epoch (or the record announces none). */
  private epochOk(msg: Msg): boolean {
    const want = this.o.epoch;
    if (want === undefined) return true;
    if (msg.headers?.get(KV_EPOCH_HEADER) === want) return true;
    this.seq.refuse("epoch", readKvSeq(msg.data));
    return false;
  }

  private replayPage(start: number): Promise<ReplayPage | null> {
    const nc = this.o.nc;
    const inbox = createInbox();
    const msgs: Uint8Array[] = [];
    return new Promise((resolve) => {
      let sub: Subscription | undefined;
      // A stall timeout: a page that keeps arriving is not cut, however slow the box.
      const timer = setTimeout(() => {
        sub?.unsubscribe();
        resolve(null);
      }, this.o.replayTimeoutMs ?? 2000);
      timer.unref();
      sub = nc.subscribe(inbox, {
        callback: (err, msg) => {
          if (err) return;
          if (msg.headers?.code === 503) {
            clearTimeout(timer);
            sub?.unsubscribe();
            resolve(null);
            return;
          }
          if (!this.epochOk(msg)) return;
          const end = decodeReplayEnd(msg.data);
          if (end) {
            clearTimeout(timer);
            sub?.unsubscribe();
            resolve({ msgs, end });
            return;
          }
          msgs.push(msg.data);
          timer.refresh();
        },
      });
      try {
        nc.publish(this.replaySubject, encodeReplayRequest(start, this.o.replayPage ?? 1000), {
          reply: inbox,
        });
      } catch {
        clearTimeout(timer);
        sub.unsubscribe();
        resolve(null);
      }
    });
  }
}

export async function startKvSubscriber(o: NatsKvSubscriberOptions): Promise<NatsKvSubscriber> {
  const s = new NatsKvSubscriber(o);
  await s.start();
  return s;
}
