/**
 * One worker rank's KV event feed: a ZMQ SUB socket on the rank's events endpoint, applied to
 * the shared KvIndex (under that rank) in sequence order. At start it replays the engine's
 * buffer from seq 0 (so a new server replica builds the full index, not only what it routed
 * itself); a gap in `seq` replays the missing range through a DEALER on the replay socket
 * (../replay.ts: streamed, resumed after drops, a stall timeout rather than a total one).
 *
 * Sync state (IndexSync, reported to the index, which routes a rank that is not `synced` as
 * untracked): `syncing` while the start-up replay runs; `synced` once it reached the end of a
 * buffer that holds the rank's whole history; `unknown` when the history cannot be had (no
 * replay socket and the first live batch is not seq 0, the replay failed, or the buffer no
 * longer reaches back to what is missing). An unknown rank keeps applying events and becomes
 * `synced` when the engine clears its cache (AllBlocksCleared) or, with a known pool size, once
 * the events since the hole stored a pool's worth of blocks (the cache has turned over; blocks
 * that stayed cached all along by being hit are the approximation). A gap filled by the replay
 * keeps the rank as it is; an unfillable one resets it (its entries may be long gone) and makes
 * it `unknown`, never "empty".
 *
 * Restarts: vLLM's and SGLang's publishers number batches from 0 per process
 * (`itertools.count()` / `_next_seq = 0`), so a live sequence number that goes backwards, or a
 * live batch whose seq the start-up replay already delivered with different bytes, means the
 * engine restarted (possibly with its first batches missed); SGLang's snapshot mode also says so
 * with a new `sgl-kv-epoch` in the topic. The rank is then reset and rebuilt from the new
 * engine's replay buffer, and the case is counted. A live batch that merely repeats one the
 * replay delivered is skipped. Nothing a worker sends can throw out of here.
 *
 * Length (≈ 500 lines, over the ~400 guide): the sequence rules above are one state machine
 * (last seq, last live seq, replayed payloads, reconnect flag) that every path reads and
 * writes; reading the socket (./zmq-reader.ts), the replay protocol (../replay.ts) and the sync
 * rule (../rank-sync.ts) are already out of it.
 */
import { Dealer } from "zeromq";
// Before any socket: one KV socket set per worker/engine passes libzmq's default 1023.
import "../../util/zmq-limits.ts";
import type { KvEventsInfo } from "../../discovery/types.ts";
import type { Logger } from "../../util/log.ts";
import { decodeBatch, decodeMessage, type EventBatch, encodeSeq, isDecodeError, readSeq } from "../events.ts";
import type { KvIndex } from "../index.ts";
import type { KvIngestMetrics } from "../metrics.ts";
import type { IndexSync } from "../prefix-index.ts";
import { RankSync } from "../rank-sync.ts";
import { streamReplay } from "../replay.ts";
import type { KvFeed, KvZmqReader } from "./types.ts";
import { openZmqReader, type ZmqReader } from "./zmq-reader.ts";

export interface ZmqKvFeedOptions {
  workerId: string;
  /** Sockets and framing; `endpoint`/`replayEndpoint` are this rank's. */
  events: KvEventsInfo;
  /** The data-parallel rank these sockets belong to (default 0). */
  dpRank?: number;
  /** The engine's pool size from the record (caps this rank in the index). */
  kvBlocks?: number;
  /** From the worker record; events' own block_size overrides it. */
  blockSize: number;
  index: KvIndex;
  logger: Logger;
  metrics?: KvIngestMetrics;
  /**
   * How long a replay may go without a reply (default 2000 ms): a stall timeout, not one for the
   * whole replay, which lasts as long as it keeps delivering.
   */
  replayTimeoutMs?: number;
  /** Replay the engine's buffer from seq 0 at start (default true). */
  replayOnStart?: boolean;
  /**
   * How the SUB socket is read (./zmq-reader.ts): `native` (libzmq's C API, many messages per
   * wake-up) when it loads, else `zeromq` (zeromq.js, one promise per message). Default `native`.
   */
  reader?: KvZmqReader;
}

export interface ZmqKvFeedStats {
  batches: number;
  events: number;
  malformed: number;
  gaps: number;
  replays: number;
  resets: number;
  /** Engine restarts seen (seq went back, replayed bytes changed, or a new SGLang epoch). */
  restarts: number;
  lastSeq: number;
  /** Replay rounds (a round ends at the end marker, a drop in transit or a stall). */
  replayRounds: number;
  /** Batches applied from replays. */
  replayed: number;
  /** The rank's sync state, and ms from start() to the first `synced` (-1: not yet). */
  sync: IndexSync;
  syncMs: number;
}

/** Replayed batches remembered to tell a live duplicate from a restarted engine's batch. */
const REPLAYED_KEPT = 256;

export class ZmqKvFeed implements KvFeed {
  private readonly opts: ZmqKvFeedOptions;
  private sub: ZmqReader | null = null;
  /** Reused copy of the last live payload, when the reader's frames are overwritten. */
  private keepBuf = Buffer.alloc(0);
  private closed = false;
  private lastSeq = -1;
  /** Last seq received on the SUB socket itself (-1: none yet). */
  private lastLiveSeq = -1;
  /**
   * Payloads of the last batches the replay delivered beyond the last live seq (a live copy
   * with the same bytes is a duplicate, other bytes a restart). Only the newest few are kept:
   * live duplicates are of what the engine sent while the replay ran.
   */
  private replayed = new Map<number, Uint8Array>();
  private epoch: string | null = null;
  /** Payload of the batch applied as `lastSeq` (a reference, for the check after a reconnect). */
  private lastPayload: Uint8Array | null = null;
  /** Set when the PUB connection dropped: the engine may have restarted behind it. */
  private reconnected = false;
  private syncedResolve!: () => void;
  /** Resolves once the start-up replay is done and live events are being applied. */
  readonly synced: Promise<void>;
  private loop: Promise<void> | null = null;
  readonly stats: ZmqKvFeedStats = {
    batches: 0,
    events: 0,
    malformed: 0,
    gaps: 0,
    replays: 0,
    resets: 0,
    restarts: 0,
    lastSeq: -1,
    replayRounds: 0,
    replayed: 0,
    sync: "syncing",
    syncMs: -1,
  };
  /** The rank's sync state and the rebuild rule (../rank-sync.ts); made by start(). */
  private rs: RankSync | null = null;

  constructor(opts: ZmqKvFeedOptions) {
    this.opts = opts;
    this.synced = new Promise((r) => {
      this.syncedResolve = r;
    });
  }

  get workerId(): string {
    return this.opts.workerId;
  }

  get dpRank(): number {
    return this.opts.dpRank ?? 0;
  }

  /** How the SUB socket is read (known once started). */
  get reader(): KvZmqReader {
    return this.sub?.kind ?? "zeromq";
  }

  /** The rank's sync state. */
  get sync(): IndexSync {
    return this.rs?.state ?? "syncing";
  }

  get syncMs(): number {
    return this.stats.syncMs;
  }

  start(): void {
    if (this.loop) return;
    this.opts.index.addWorker(this.opts.workerId, this.opts.blockSize, 0, this.opts.kvBlocks);
    this.rs = new RankSync({
      index: this.opts.index,
      workerId: this.opts.workerId,
      rank: this.dpRank,
      kvBlocks: this.opts.kvBlocks,
      onChange: (state) => {
        this.stats.sync = state;
        this.stats.syncMs = this.rs?.syncMs ?? -1;
        this.opts.logger.info({ worker: this.opts.workerId, rank: this.dpRank, state }, "kv index sync");
      },
    });
    this.loop = this.run().catch((err) => {
      if (!this.closed) this.opts.logger.error({ err, worker: this.opts.workerId }, "kv subscriber stopped");
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    this.rs?.close();
    this.syncedResolve();
    this.sub?.close();
    await this.loop;
  }

  private async run(): Promise<void> {
    const { events } = this.opts;
    this.sub = openZmqReader(events.endpoint, events.topic ?? "", this.opts.reader, {
      message: (frames) => this.handle(frames),
      // A dropped connection is how a restart looks from here when the new engine's first
      // sequence numbers happen to continue ours; the next batch is checked against the replay.
      disconnected: () => {
        this.reconnected = true;
      },
      malformed: (e) => this.malformed(e),
      failed: (err) => {
        if (!this.closed)
          this.opts.logger.error({ err, worker: this.opts.workerId }, "kv subscriber stopped");
      },
    });
    if (events.framing === "seq" && events.replayEndpoint && this.opts.replayOnStart !== false) {
      await this.replay(0);
      this.settle();
    } else if (this.opts.replayOnStart === false) {
      // The caller knows the engine starts with us: what arrives is its whole history.
      this.rs?.set("synced");
    } else {
      // No replay socket: only a first live batch numbered 0 says nothing came before it.
      this.markHole();
      this.rs?.settle();
    }
    this.syncedResolve();
    if (!this.closed) this.sub.start();
  }

  /**
   * One live message. Synchronous unless it needs a replay, a restart or the reconnect check:
   * then a promise the reader waits for before reading on. When the reader reuses its frames,
   * the slow paths take copies first.
   */
  private handle(frames: Uint8Array[]): Promise<void> | undefined {
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
    // The topic is matched up to its first NUL: SGLang's snapshot mode appends its epoch there.
    if (events.topic && msg.topic !== events.topic && frames.length !== 1) return;
    if (msg.epoch !== null) {
      if (this.epoch !== null && msg.epoch !== this.epoch) {
        this.epoch = msg.epoch;
        return this.restart("epoch", msg.seq, this.own(frames));
      }
      this.epoch = msg.epoch;
    }
    const seq = msg.seq;
    if (this.reconnected) {
      this.reconnected = false;
      // ATOM numbers nothing, so any batch seen before the drop makes the check necessary.
      const seen = this.lastSeq >= 0 || (seq === null && this.stats.batches > 0);
      if (seen) {
        // Handled again once the engine is known to be the same (the flag is down by then).
        const own = this.own(frames);
        return this.sameEngine().then((same) =>
          same ? this.handle(own) : this.restart("reconnect", seq, own),
        );
      }
    }
    if (seq === null) {
      this.apply(msg.batch);
      return;
    }
    const lastLive = this.lastLiveSeq;
    this.lastLiveSeq = seq;
    if (this.lastSeq < 0) {
      if (seq === 0 && this.rs?.open && this.stats.batches === 0) this.clearHole();
      this.apply(msg.batch);
      this.setSeq(seq);
      this.keep(frames[2]);
      return;
    }
    if (seq <= this.lastSeq) {
      if (seq <= lastLive) {
        // The live stream itself went backwards: a new publisher numbering from 0 again.
        return this.restart("backward", seq, this.own(frames));
      }
      // Delivered by the replay already: the same bytes are a duplicate, other bytes mean the
      // engine restarted after the replay answered (its first batches perhaps missed).
      const known = this.replayed.get(seq);
      for (const k of this.replayed.keys()) {
        if (k > seq) break; // insertion order is seq order
        this.replayed.delete(k);
      }
      if (
        known !== undefined &&
        !Buffer.from(known.buffer, known.byteOffset, known.byteLength).equals(frames[2])
      )
        return this.restart("restart", seq, this.own(frames));
      return;
    }
    this.replayed.clear();
    if (seq > this.lastSeq + 1) {
      this.stats.gaps++;
      this.opts.logger.warn(
        { worker: workerId, rank: this.dpRank, expected: this.lastSeq + 1, got: seq },
        "kv event gap",
      );
      this.opts.metrics?.sequence.inc({ kind: "gap" });
      if (events.replayEndpoint) {
        const own = this.own(frames);
        return this.replay(this.lastSeq + 1).then(() => {
          const again = decodeMessage(own, events.framing);
          if (!isDecodeError(again)) this.afterGap(seq, own, again.batch);
        });
      }
      this.afterGap(seq, frames, msg.batch);
      return;
    }
    this.apply(msg.batch);
    this.setSeq(seq);
    this.keep(frames[2]);
  }

  /** After a gap and its replay (if any): a jump still there resets the rank; then the batch. */
  private afterGap(seq: number, frames: Uint8Array[], batch: EventBatch): void {
    if (seq <= this.lastSeq) return;
    if (seq > this.lastSeq + 1) {
      // A jump the replay could not fill (no replay socket, or it failed): what the index
      // holds may be long gone from the engine, and what it lacks cannot be had.
      this.opts.metrics?.sequence.inc({ kind: "jump" });
      this.reset("jump");
      this.markHole();
    }
    this.apply(batch);
    this.setSeq(seq);
    this.keep(frames[2]);
  }

  /** Frames that outlive the next read: the native reader's are copied. */
  private own(frames: Uint8Array[]): Uint8Array[] {
    return this.sub?.reusesFrames ? frames.map((f) => Buffer.from(f)) : frames;
  }

  /** Remembers the last live payload (for the check after a reconnect), copied when native. */
  private keep(payload: Uint8Array): void {
    if (!this.sub?.reusesFrames) {
      this.lastPayload = payload;
      return;
    }
    if (this.keepBuf.length < payload.length)
      this.keepBuf = Buffer.allocUnsafe(Math.max(payload.length, 2 * this.keepBuf.length, 256));
    this.keepBuf.set(payload);
    this.lastPayload = this.keepBuf.subarray(0, payload.length);
  }

  /**
   * After a reconnect: does the engine's replay buffer still hold our last batch, byte for byte?
   * A restarted engine's buffer has other bytes under that seq (or does not reach it). Without a
   * replay socket (ATOM, or none configured) it cannot be told, and a restart is assumed: an
   * index emptied for nothing costs some cache hits, one kept for a dead cache misroutes.
   */
  private async sameEngine(): Promise<boolean> {
    const ep = this.opts.events.replayEndpoint;
    if (!ep || this.opts.events.framing !== "seq" || this.lastPayload === null) return false;
    const dealer = new Dealer({ linger: 0, receiveTimeout: this.opts.replayTimeoutMs ?? 2000 });
    try {
      dealer.connect(ep);
      await dealer.send([Buffer.alloc(0), encodeSeq(this.lastSeq)]);
      const frames = await dealer.receive();
      const parts = frames.length >= 3 && frames[0].length === 0 ? frames.slice(1) : frames;
      return readSeq(parts[0]) === this.lastSeq && parts.length >= 2 && parts[1].equals(this.lastPayload);
    } catch {
      return false;
    } finally {
      dealer.close();
    }
  }

  /**
   * The engine behind this rank restarted: forget the rank, then rebuild it from the new
   * engine's replay buffer (which holds the batch that revealed the restart); without a replay
   * socket, start again from that batch.
   */
  private async restart(kind: string, seq: number | null, frames: Uint8Array[]): Promise<void> {
    this.stats.restarts++;
    this.opts.metrics?.sequence.inc({ kind });
    this.opts.logger.warn(
      { worker: this.opts.workerId, rank: this.dpRank, kind, seq, lastSeq: this.lastSeq },
      "kv events: engine restart detected",
    );
    this.reset(kind === "epoch" ? "epoch" : "restart");
    this.setSeq(-1);
    this.replayed.clear();
    this.lastLiveSeq = seq ?? -1;
    if (this.opts.events.framing === "seq" && this.opts.events.replayEndpoint) {
      this.rs?.begin();
      await this.replay(0);
      this.settle();
    } else if (seq === 0) {
      // The new engine's first batch: nothing came before it.
      this.clearHole();
    } else this.markHole();
    if (seq === null || seq > this.lastSeq) {
      const msg = decodeMessage(frames, this.opts.events.framing);
      if (!isDecodeError(msg)) {
        this.apply(msg.batch);
        if (seq !== null) this.setSeq(seq);
        this.lastPayload = frames[frames.length - 1];
      }
    }
    this.replayed.clear();
  }

  private setSeq(seq: number): void {
    this.lastSeq = seq;
    this.stats.lastSeq = seq;
  }

  private apply(batch: EventBatch): void {
    const { index, workerId, blockSize, metrics } = this.opts;
    if (this.rs) this.rs.apply(batch, blockSize);
    else index.applyEvents(workerId, batch.events, blockSize, this.dpRank);
    this.stats.batches++;
    this.stats.events += batch.events.length;
    if (batch.skipped > 0) this.malformed(`${batch.skipped} undecodable events in a batch`);
    metrics?.applied(workerId, batch);
  }

  private markHole(): void {
    this.rs?.markHole();
  }

  private clearHole(): void {
    this.rs?.clearHole();
  }

  private settle(): void {
    this.rs?.settle();
  }

  private reset(reason: string): void {
    this.opts.index.clearWorker(this.opts.workerId, this.dpRank);
    this.stats.resets++;
    this.opts.metrics?.resets.inc({ reason });
    this.opts.logger.warn(
      { worker: this.opts.workerId, rank: this.dpRank, reason },
      "kv index: worker rank reset (unknown until rebuilt)",
    );
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
    const res = await streamReplay(start, {
      endpoint: events.replayEndpoint,
      stallMs: this.opts.replayTimeoutMs ?? 2000,
      lastSeq: () => this.lastSeq,
      closed: () => this.closed,
      malformed: (e) => this.malformed(e),
      deliver: (seq, payload, hole) => this.deliverReplayed(seq, payload, hole),
    });
    this.stats.replayRounds += res.rounds;
    if (res.outcome === "closed") return;
    if (res.outcome === "failed") {
      logger.warn({ worker: workerId, rank: this.dpRank, err: res.error, start }, "kv replay failed");
      // What the replay was to fill cannot be had (a gap's caller then resets the rank).
      this.markHole();
    } else if (res.rounds > 1)
      logger.info(
        { worker: workerId, rank: this.dpRank, rounds: res.rounds, batches: res.batches },
        "kv replay resumed",
      );
    metrics?.replays.inc({ result: res.outcome === "hole" ? "incomplete" : res.outcome });
  }

  private deliverReplayed(seq: number, payload: Uint8Array | null, hole: boolean): void {
    if (hole) {
      // The engine's buffer no longer holds the missing batches.
      this.opts.metrics?.sequence.inc({ kind: "jump" });
      if (this.lastSeq >= 0 || this.opts.index.blockCount(this.opts.workerId, this.dpRank) > 0)
        this.reset("gap");
      this.markHole();
    }
    const batch = payload ? decodeBatch(payload) : { error: "replay reply without payload" };
    if (isDecodeError(batch)) this.malformed(batch.error);
    else this.apply(batch);
    this.setSeq(seq);
    this.stats.replayed++;
    if (payload) this.lastPayload = payload;
    // Remember what the replay delivered past the live stream, to tell a later live copy
    // (skip) from a restarted engine's different batch under the same seq.
    if (seq > this.lastLiveSeq && payload) {
      this.replayed.set(seq, payload);
      if (this.replayed.size > REPLAYED_KEPT)
        this.replayed.delete(this.replayed.keys().next().value as number);
    }
  }
}
