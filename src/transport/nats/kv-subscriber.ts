/**
 * Server side of the NATS KV-event plane: follows one worker's `infera.kv.<model>.<worker>`,
 * delivers batches to a sink strictly in sequence order, and recovers from gaps by asking the
 * worker's agent to replay (kv-wire.ts). Where the agent no longer has what is missing, the sink
 * is told to reset the worker (treat it as empty) and delivery continues from what exists, the
 * same contract as the ZMQ replay path. On start it replays the agent's buffer, so a new server
 * replica builds its index from history, not only from what arrives after it.
 */
import { createInbox, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import type { KvBatchSink, KvBatchStream, KvRefusal } from "../../kv/feeds/types.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import { decodeReplayEnd, encodeReplayRequest, KV_EPOCH_HEADER, kvPayload, readKvSeq } from "./kv-wire.ts";
import { kvReplaySubject } from "./subjects.ts";

/** At most one refusal warning per subscriber this often; the rest are counted in the log line. */
const REFUSAL_LOG_MS = 10_000;

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

export interface NatsKvSubscriberStats {
  delivered: number;
  replayed: number;
  gaps: number;
  resets: number;
  duplicates: number;
  /** Batches refused: another epoch than the record's, or a restart no record announced. */
  refused: number;
}

export class NatsKvSubscriber implements KvBatchStream {
  private readonly o: NatsKvSubscriberOptions;
  readonly stats: NatsKvSubscriberStats = {
    delivered: 0,
    replayed: 0,
    gaps: 0,
    resets: 0,
    duplicates: 0,
    refused: 0,
  };
  private lastRefusalLog = 0;
  private refusalsUnlogged = 0;
  private live?: Subscription;
  /** Next seq to deliver; null until the first batch or replay fixes it. */
  private expected: number | null = null;
  private recovering = false;
  /** Live messages that arrived during a recovery, delivered after it. */
  private pending: Uint8Array[] = [];
  private closed = false;
  private readonly log: Logger;
  private readonly replaySubject: string;

  constructor(o: NatsKvSubscriberOptions) {
    this.o = o;
    this.log = o.logger ?? createLogger("nats-kv-sub", { subject: o.subject });
    this.replaySubject = kvReplaySubject(o.subject);
  }

  /** Resolves after the initial replay (if any) is applied. */
  async start(): Promise<void> {
    this.live = this.o.nc.subscribe(this.o.subject, {
      callback: (err, msg) => {
        if (!err && this.epochOk(msg)) this.onLive(msg.data);
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

  /** The batch carries the record's epoch (or the record announces none). */
  private epochOk(msg: Msg): boolean {
    const want = this.o.epoch;
    if (want === undefined) return true;
    if (msg.headers?.get(KV_EPOCH_HEADER) === want) return true;
    this.refuse("epoch", readKvSeq(msg.data));
    return false;
  }

  /** Counts a refused batch and warns, at most once per REFUSAL_LOG_MS. */
  private refuse(reason: KvRefusal, seq: number | undefined): void {
    this.stats.refused++;
    try {
      this.o.sink.onRefused?.(reason);
    } catch {}
    const now = Date.now();
    if (now - this.lastRefusalLog < REFUSAL_LOG_MS) {
      this.refusalsUnlogged++;
      return;
    }
    this.log.warn(
      { reason, seq, expected: this.expected, suppressed: this.refusalsUnlogged },
      reason === "epoch"
        ? "kv batch refused: not stamped with the epoch the worker's record announces"
        : "kv batch refused: sequence restart that no new worker record announced",
    );
    this.lastRefusalLog = now;
    this.refusalsUnlogged = 0;
  }

  private onLive(msg: Uint8Array): void {
    if (this.closed) return;
    if (this.recovering) {
      this.pending.push(msg);
      return;
    }
    this.accept(msg);
  }

  /**
   * Applies one message in order; a gap starts a recovery (the message waits in pending).
   * `queued`: it arrived live during a replay, which may have delivered it already, so a seq
   * from before is a duplicate, not a restart claim.
   */
  private accept(msg: Uint8Array, queued = false): void {
    const seq = readKvSeq(msg);
    if (seq === undefined || seq < 0) return;
    const exp = this.expected;
    if (exp === null || seq === exp) {
      this.deliver(seq, msg);
      return;
    }
    if (seq < exp) {
      // A seq from before: a duplicate (replay overlap), or a claim that the engine restarted
      // from 0. A genuine restart comes with a new relay epoch announced in a new record, which
      // reopens this feed from scratch (kv-ingest.ts keys feeds by epoch); a bare seq 0 on a
      // running feed proves nothing (anyone who can publish here can send it), so it is refused.
      if (seq === 0 && !queued) this.refuse("restart", seq);
      else this.stats.duplicates++;
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
      else this.accept(m, true);
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
