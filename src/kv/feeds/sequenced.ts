/**
 * The sequence rules of a replayable batch stream (the NATS KV plane's; its wire is
 * src/transport/nats/kv-subscriber.ts): batches go to the sink strictly in sequence order; a
 * gap asks the replay for what is missing, page by page, while later live batches wait; where
 * the replay no longer has it, the sink is told to reset the rank and delivery goes on from
 * what exists (the same contract as the ZMQ plane's replay, ./zmq.ts). A seq from before is a
 * duplicate, except a bare seq 0 on a running stream, which claims an engine restart that no
 * record announced: refused and counted. The start-up replay that cannot reach seq 0 leaves
 * the rank unknown (the sink's `onUnknown`).
 */
import type { Logger } from "../../util/log.ts";
import type { KvBatchSink, KvRefusal } from "./types.ts";

/** At most one refusal warning per stream this often; the rest are counted in the log line. */
const REFUSAL_LOG_MS = 10_000;

/** One page of a replay: the batches, then the end marker's view of the buffer. */
export interface ReplayPage {
  msgs: Uint8Array[];
  end: { oldest: number; next: number };
}

/** What the rules need from the wire. */
export interface SequencedWire {
  /** A message's sequence number (undefined: not a batch). */
  seqOf(msg: Uint8Array): number | undefined;
  /** The engine's EventBatch bytes inside a message. */
  payloadOf(msg: Uint8Array): Uint8Array;
  /** The replay's batches from `start`, or null when nothing answered (or refused). */
  replayPage(start: number): Promise<ReplayPage | null>;
}

export interface SequencedStats {
  delivered: number;
  replayed: number;
  gaps: number;
  resets: number;
  duplicates: number;
  /** Batches refused: another epoch than the record's, or a restart no record announced. */
  refused: number;
}

export class SequencedBatches {
  readonly stats: SequencedStats = {
    delivered: 0,
    replayed: 0,
    gaps: 0,
    resets: 0,
    duplicates: 0,
    refused: 0,
  };
  private readonly sink: KvBatchSink;
  private readonly wire: SequencedWire;
  private readonly log: Logger;
  private lastRefusalLog = 0;
  private refusalsUnlogged = 0;
  /** Next seq to deliver; null until the first batch or replay fixes it. */
  private expected: number | null = null;
  private recovering = false;
  /** Live messages that arrived during a recovery, delivered after it. */
  private pending: Uint8Array[] = [];
  private closed = false;

  constructor(o: { sink: KvBatchSink; wire: SequencedWire; logger: Logger }) {
    this.sink = o.sink;
    this.wire = o.wire;
    this.log = o.logger;
  }

  /** The next sequence number to deliver (null before any). */
  get nextSeq(): number | null {
    return this.expected;
  }

  close(): void {
    this.closed = true;
  }

  /** Counts a refused batch and warns, at most once per REFUSAL_LOG_MS. */
  refuse(reason: KvRefusal, seq: number | undefined): void {
    this.stats.refused++;
    try {
      this.sink.onRefused?.(reason);
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

  onLive(msg: Uint8Array): void {
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
    const seq = this.wire.seqOf(msg);
    if (seq === undefined || seq < 0) return;
    const exp = this.expected;
    if (exp === null || seq === exp) {
      this.deliver(seq, msg);
      return;
    }
    if (seq < exp) {
      // A seq from before: a duplicate (replay overlap), or a claim that the engine restarted
      // from 0. A genuine restart comes with a new relay epoch announced in a new record, which
      // reopens this feed from scratch (src/transport/nats/kv-ingest.ts keys feeds by epoch); a bare seq 0 on a
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
      this.sink.onBatch(seq, this.wire.payloadOf(msg));
    } catch (err) {
      this.log.warn({ err: String(err), seq }, "kv sink failed on a batch");
    }
  }

  private unknown(reason: string): void {
    this.log.info({ reason }, "kv history before the start-up replay cannot be had");
    try {
      this.sink.onUnknown?.(reason);
    } catch (err) {
      this.log.warn({ err: String(err) }, "kv sink failed on unknown");
    }
  }

  private reset(reason: string): void {
    this.stats.resets++;
    this.log.warn({ reason }, "kv history lost; resetting worker");
    try {
      this.sink.onReset(reason);
    } catch (err) {
      this.log.warn({ err: String(err) }, "kv sink failed on reset");
    }
  }

  /** Pages replay from `from` until caught up, then drains what arrived live meanwhile. */
  async recover(from: number, initial: boolean): Promise<void> {
    if (this.recovering) return;
    this.recovering = true;
    try {
      let start = from;
      let first = true;
      for (;;) {
        const page = await this.wire.replayPage(start);
        if (this.closed) return;
        if (!page) {
          // The agent did not answer: deliver what we have; the next gap asks again.
          if (!initial && this.expected !== null) this.reset("replay unavailable");
          else if (initial) this.unknown("replay unavailable at start");
          break;
        }
        const { msgs, end } = page;
        const firstSeq = msgs.length > 0 ? this.wire.seqOf(msgs[0])! : end.next;
        // History before `firstSeq` is gone. At start with an empty index there is nothing to
        // drop, so only a gap mid-run (or lost history after one) is a reset.
        if (first && firstSeq > start && (!initial || start > 0)) {
          this.reset(`batches ${start}..${firstSeq - 1} no longer buffered by the agent`);
        } else if (first && firstSeq > start)
          this.unknown(`batches ${start}..${firstSeq - 1} no longer buffered`);
        first = false;
        if (this.expected === null || firstSeq > this.expected) this.expected = firstSeq;
        for (const m of msgs) {
          const s = this.wire.seqOf(m)!;
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
    queued.sort((a, b) => this.wire.seqOf(a)! - this.wire.seqOf(b)!);
    for (const m of queued) {
      if (this.recovering) this.pending.push(m);
      else this.accept(m, true);
    }
  }
}
