/**
 * Server side of the NATS KV-event plane: follows one worker's `infera.kv.<model>.<worker>`,
 * delivers batches to a sink strictly in sequence order, and recovers from gaps by asking the
 * worker's agent to replay (kv-wire.ts). Where the agent no longer has what is missing, the sink
 * is told to reset the worker (treat it as empty) and delivery continues from what exists, the
 * same contract as the ZMQ replay path. On start it replays the agent's buffer, so a new server
 * replica builds its index from history, not only from what arrives after it.
 */
import { createInbox, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { createLogger, type Logger } from "../../util/log.ts";
import { decodeReplayEnd, encodeReplayRequest, kvPayload, readKvSeq } from "./kv-wire.ts";
import { kvReplaySubject } from "./subjects.ts";

export interface KvBatchSink {
  /** One engine EventBatch (msgpack bytes, unchanged) with its engine sequence number. */
  onBatch(seq: number, payload: Uint8Array): void;
  /** History was lost (or the engine restarted): drop what is known about this worker. */
  onReset(reason: string): void;
  /**
   * The start-up replay could not give the whole history (the agent did not answer, or its
   * buffer no longer reaches back to seq 0): what the sink holds is partial, not "empty".
   */
  onUnknown?(reason: string): void;
}

export interface KvSubscriberOptions {
  nc: NatsConnection;
  /** The worker's KV subject (`kvSubject(model, id)`). */
  subject: string;
  sink: KvBatchSink;
  /** Replay the agent's buffer on start (default true). */
  replayOnStart?: boolean;
  /** Batches asked per replay page (default 1000). */
  replayPage?: number;
  /** How long a replay page may go without a message (default 2000 ms): a stall timeout. */
  replayTimeoutMs?: number;
  logger?: Logger;
}

export interface KvSubscriberStats {
  delivered: number;
  replayed: number;
  gaps: number;
  resets: number;
  duplicates: number;
}

export class NatsKvSubscriber {
  private readonly o: KvSubscriberOptions;
  readonly stats: KvSubscriberStats = { delivered: 0, replayed: 0, gaps: 0, resets: 0, duplicates: 0 };
  private live?: Subscription;
  /** Next seq to deliver; null until the first batch or replay fixes it. */
  private expected: number | null = null;
  private recovering = false;
  /** Live messages that arrived during a recovery, delivered after it. */
  private pending: Uint8Array[] = [];
  private closed = false;
  private readonly log: Logger;
  private readonly replaySubject: string;

  constructor(o: KvSubscriberOptions) {
    this.o = o;
    this.log = o.logger ?? createLogger("nats-kv-sub", { subject: o.subject });
    this.replaySubject = kvReplaySubject(o.subject);
  }

  /** Resolves after the initial replay (if any) is applied. */
  async start(): Promise<void> {
    this.live = this.o.nc.subscribe(this.o.subject, {
      callback: (err, msg) => {
        if (!err) this.onLive(msg.data);
      },
    });
    await this.o.nc.flush();
    if (this.o.replayOnStart ?? true) await this.recover(0, true);
  }

  close(): void {
    this.closed = true;
    this.live?.unsubscribe();
  }

  /** The next sequence number this subscriber will deliver (null before any). */
  get nextSeq(): number | null {
    return this.expected;
  }

  private onLive(msg: Uint8Array): void {
    if (this.closed) return;
    if (this.recovering) {
      this.pending.push(msg);
      return;
    }
    this.accept(msg);
  }

  /** Applies one message in order; a gap starts a recovery (the message waits in pending). */
  private accept(msg: Uint8Array): void {
    const seq = readKvSeq(msg);
    if (seq === undefined || seq < 0) return;
    const exp = this.expected;
    if (exp === null || seq === exp) {
      this.deliver(seq, msg);
      return;
    }
    if (seq < exp) {
      // A seq from before: either a duplicate (replay overlap) or the engine restarted from 0.
      if (seq === 0) {
        this.reset("engine sequence restarted");
        this.deliver(seq, msg);
      } else this.stats.duplicates++;
      return;
    }
    this.stats.gaps++;
    this.pending.push(msg);
    void this.recover(exp, false);
  }

  private deliver(seq: number, msg: Uint8Array): void {
    this.expected = seq + 1;
    this.stats.delivered++;
    try {
      this.o.sink.onBatch(seq, kvPayload(msg));
    } catch (err) {
      this.log.warn({ err: String(err), seq }, "kv sink failed on a batch");
    }
  }

  private unknown(reason: string): void {
    this.log.info({ reason }, "kv history before the start-up replay cannot be had");
    try {
      this.o.sink.onUnknown?.(reason);
    } catch (err) {
      this.log.warn({ err: String(err) }, "kv sink failed on unknown");
    }
  }

  private reset(reason: string): void {
    this.stats.resets++;
    this.log.warn({ reason }, "kv history lost; resetting worker");
    try {
      this.o.sink.onReset(reason);
    } catch (err) {
      this.log.warn({ err: String(err) }, "kv sink failed on reset");
    }
  }

  /** Pages replay from `from` until caught up, then drains what arrived live meanwhile. */
  private async recover(from: number, initial: boolean): Promise<void> {
    if (this.recovering) return;
    this.recovering = true;
    try {
      let start = from;
      let first = true;
      for (;;) {
        const page = await this.replayPage(start);
        if (this.closed) return;
        if (!page) {
          // The agent did not answer: deliver what we have; the next gap asks again.
          if (!initial && this.expected !== null) this.reset("replay unavailable");
          else if (initial) this.unknown("replay unavailable at start");
          break;
        }
        const { msgs, end } = page;
        const firstSeq = msgs.length > 0 ? readKvSeq(msgs[0])! : end.next;
        // History before `firstSeq` is gone. At start with an empty index there is nothing to
        // drop, so only a gap mid-run (or lost history after one) is a reset.
        if (first && firstSeq > start && (!initial || start > 0)) {
          this.reset(`batches ${start}..${firstSeq - 1} no longer buffered by the agent`);
        } else if (first && firstSeq > start)
          this.unknown(`batches ${start}..${firstSeq - 1} no longer buffered`);
        first = false;
        if (this.expected === null || firstSeq > this.expected) this.expected = firstSeq;
        for (const m of msgs) {
          const s = readKvSeq(m)!;
          if (s < this.expected!) continue;
          if (s > this.expected!) {
            // A hole inside the agent's buffer (it lost them from the engine): reset and go on.
            this.reset(`batches ${this.expected}..${s - 1} missing at the agent`);
          }
          this.stats.replayed++;
          this.deliver(s, m);
        }
        if (msgs.length === 0 || this.expected! >= end.next) break;
        start = this.expected!;
      }
    } finally {
      this.recovering = false;
    }
    const queued = this.pending;
    this.pending = [];
    queued.sort((a, b) => readKvSeq(a)! - readKvSeq(b)!);
    for (const m of queued) {
      if (this.recovering) this.pending.push(m);
      else this.accept(m);
    }
  }

  private replayPage(
    start: number,
  ): Promise<{ msgs: Uint8Array[]; end: { oldest: number; next: number } } | null> {
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

export async function startKvSubscriber(o: KvSubscriberOptions): Promise<NatsKvSubscriber> {
  const s = new NatsKvSubscriber(o);
  await s.start();
  return s;
}
