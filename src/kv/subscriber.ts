/**
 * One worker's KV event feed: a ZMQ SUB socket on the worker's events endpoint, applied to the
 * shared KvIndex in sequence order. At start it replays the engine's buffer from seq 0 (so a new
 * server replica builds the full index, not only what it routed itself); a gap in `seq` replays
 * the missing range through a DEALER on the replay socket, and when that cannot fill it the
 * worker is reset to empty (engine-protocols.md §3). Nothing a worker sends can throw out of here.
 */
import { Dealer, Subscriber } from "zeromq";
import type { KvEventsInfo } from "../discovery/types.ts";
import type { Logger } from "../util/log.ts";
import { decodeBatch, decodeMessage, type EventBatch, encodeSeq, isDecodeError, readSeq } from "./events.ts";
import type { KvIndex } from "./index.ts";
import type { KvIngestMetrics } from "./metrics.ts";

export interface KvSubscriberOptions {
  workerId: string;
  events: KvEventsInfo;
  /** From the worker record; events' own block_size overrides it. */
  blockSize: number;
  index: KvIndex;
  logger: Logger;
  metrics?: KvIngestMetrics;
  /** How long to wait for each replay reply before giving up (default 2000 ms). */
  replayTimeoutMs?: number;
  /** Replay the engine's buffer from seq 0 at start (default true). */
  replayOnStart?: boolean;
}

export interface KvSubscriberStats {
  batches: number;
  events: number;
  malformed: number;
  gaps: number;
  replays: number;
  resets: number;
  lastSeq: number;
}

export class KvSubscriber {
  private readonly sub = new Subscriber({ linger: 0 });
  private closed = false;
  private lastSeq = -1;
  private syncedResolve!: () => void;
  /** Resolves once the start-up replay is done and live events are being applied. */
  readonly synced: Promise<void>;
  private loop: Promise<void> | null = null;
  readonly stats: KvSubscriberStats = {
    batches: 0,
    events: 0,
    malformed: 0,
    gaps: 0,
    replays: 0,
    resets: 0,
    lastSeq: -1,
  };

  constructor(private readonly opts: KvSubscriberOptions) {
    this.synced = new Promise((r) => {
      this.syncedResolve = r;
    });
  }

  get workerId(): string {
    return this.opts.workerId;
  }

  start(): void {
    if (this.loop) return;
    this.opts.index.addWorker(this.opts.workerId, this.opts.blockSize);
    this.loop = this.run().catch((err) => {
      if (!this.closed) this.opts.logger.error({ err, worker: this.opts.workerId }, "kv subscriber stopped");
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    this.syncedResolve();
    try {
      this.sub.close();
    } catch {
      // already closed
    }
    await this.loop;
  }

  private async run(): Promise<void> {
    const { events } = this.opts;
    this.sub.connect(events.endpoint);
    if (events.topic) this.sub.subscribe(events.topic);
    else this.sub.subscribe();
    if (events.framing === "seq" && events.replayEndpoint && this.opts.replayOnStart !== false)
      await this.replay(0);
    this.syncedResolve();
    while (!this.closed) {
      let frames: Buffer[];
      try {
        frames = await this.sub.receive();
      } catch (err) {
        if (this.closed) return;
        throw err;
      }
      await this.handle(frames);
    }
  }

  private async handle(frames: Buffer[]): Promise<void> {
    const { events, workerId } = this.opts;
    const msg = decodeMessage(frames, events.framing);
    if (isDecodeError(msg)) {
      this.malformed(msg.error);
      // A sequence number we can still read counts as seen: replay would return the same bytes.
      if (frames.length === 3) {
        const seq = readSeq(frames[1]);
        if (seq !== null && seq === this.lastSeq + 1) this.setSeq(seq);
      }
      return;
    }
    if (events.topic && msg.topic !== events.topic && frames.length !== 1) return;
    const seq = msg.seq;
    if (seq === null || this.lastSeq < 0) {
      this.apply(msg.batch);
      if (seq !== null) this.setSeq(seq);
      return;
    }
    if (seq <= this.lastSeq) {
      if (seq === 0) {
        // The engine restarted and numbers from 0 again: what we hold is stale.
        this.reset("restart");
        this.apply(msg.batch);
        this.setSeq(0);
      }
      return; // a batch already applied through replay
    }
    if (seq > this.lastSeq + 1) {
      this.stats.gaps++;
      this.opts.logger.warn({ worker: workerId, expected: this.lastSeq + 1, got: seq }, "kv event gap");
      if (events.replayEndpoint) await this.replay(this.lastSeq + 1);
      if (seq <= this.lastSeq) return;
      if (seq > this.lastSeq + 1) this.reset("gap");
    }
    this.apply(msg.batch);
    this.setSeq(seq);
  }

  private setSeq(seq: number): void {
    this.lastSeq = seq;
    this.stats.lastSeq = seq;
  }

  private apply(batch: EventBatch): void {
    const { index, workerId, blockSize, metrics } = this.opts;
    index.applyEvents(workerId, batch.events, blockSize);
    this.stats.batches++;
    this.stats.events += batch.events.length;
    if (batch.skipped > 0) this.malformed(`${batch.skipped} undecodable events in a batch`);
    if (metrics) {
      metrics.batches.inc({ worker: workerId });
      for (const ev of batch.events) metrics.events.inc({ type: ev.type });
    }
  }

  private reset(reason: string): void {
    this.opts.index.clearWorker(this.opts.workerId);
    this.stats.resets++;
    this.opts.metrics?.resets.inc({ reason });
    this.opts.logger.warn({ worker: this.opts.workerId, reason }, "kv index: worker reset to empty");
  }

  private malformed(error: string): void {
    this.stats.malformed++;
    this.opts.metrics?.malformed.inc({ worker: this.opts.workerId });
    // Log the first few and then every 100th, so a broken publisher cannot flood the log.
    if (this.stats.malformed <= 5 || this.stats.malformed % 100 === 0)
      this.opts.logger.warn(
        { worker: this.opts.workerId, error, count: this.stats.malformed },
        "malformed kv event message",
      );
  }

  /** Applies every buffered batch with seq ≥ start (and > what was applied). Never throws. */
  private async replay(start: number): Promise<void> {
    const { events, workerId, logger, metrics } = this.opts;
    if (!events.replayEndpoint) return;
    this.stats.replays++;
    const dealer = new Dealer({ linger: 0, receiveTimeout: this.opts.replayTimeoutMs ?? 2000 });
    let result = "ok";
    try {
      dealer.connect(events.replayEndpoint);
      await dealer.send([Buffer.alloc(0), encodeSeq(start)]);
      for (;;) {
        if (this.closed) return;
        const frames = await dealer.receive();
        // ROUTER replies [b"", seq, payload]; tolerate a reply without the empty delimiter.
        const parts = frames.length >= 3 && frames[0].length === 0 ? frames.slice(1) : frames;
        if (parts.length < 1) continue;
        const seq = readSeq(parts[0]);
        if (seq === null) {
          this.malformed("replay reply without an 8-byte seq");
          continue;
        }
        if (seq === -1) break;
        if (seq <= this.lastSeq) continue;
        if (this.lastSeq >= 0 && seq > this.lastSeq + 1) {
          // The engine's buffer no longer holds the missing batches.
          result = "incomplete";
          this.reset("gap");
        }
        const batch = parts.length >= 2 ? decodeBatch(parts[1]) : { error: "replay reply without payload" };
        if (isDecodeError(batch)) this.malformed(batch.error);
        else this.apply(batch);
        this.setSeq(seq);
      }
    } catch (err) {
      if (this.closed) return;
      result = "failed";
      logger.warn({ worker: workerId, err: (err as Error).message, start }, "kv replay failed");
    } finally {
      metrics?.replays.inc({ result });
      dealer.close();
    }
  }
}
