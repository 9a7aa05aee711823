/**
 * Agent side of the NATS KV-event plane: subscribes to its engine's ZMQ PUB socket and
 * republishes every batch on `infera.kv.<model>.<worker>` with the engine's sequence number
 * intact and the payload byte for byte (kv-wire.ts). Servers then follow one NATS subject per
 * worker instead of connecting to every engine.
 *
 * Missed batches: between engine and agent, a sequence gap is filled from the engine's replay
 * socket (vLLM/SGLang); between agent and servers, the agent keeps the last `bufferBatches`
 * messages and answers replay requests on `<subject>.replay`, which is what a server asks on
 * start (to build its index from history) and on a gap.
 *
 * Data-parallel engines: vLLM and SGLang publish each DP rank on its own PUB/replay sockets
 * (port + rank) with its own sequence numbers. When the record lists `kvEvents.ranks`, the relay
 * started for the worker relays its lowest rank itself and starts one sibling relay per other
 * rank, each on `kvRankSubject(subject, rank)`.
 */
import {
  headers,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
  type Subscription,
} from "@nats-io/transport-node";
import { Dealer, Subscriber } from "zeromq";
import type { KvEventsInfo } from "../../discovery/types.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import { KvRing } from "./kv-ring.ts";
import {
  decodeReplayRequest,
  encodeKvMessage,
  encodeReplayEnd,
  KV_EPOCH_HEADER,
  kvRankSubject,
  newKvEpoch,
  readKvSeq,
  SEQ_BYTES,
  seqFrame,
} from "./kv-wire.ts";
import { kvReplaySubject, kvSubject } from "./subjects.ts";

export interface KvRelayOptions {
  nc: NatsConnection;
  model: string;
  workerId: string;
  /** The engine's ZMQ endpoints, as in the worker record (connectable addresses, never `*`). */
  events: KvEventsInfo;
  /** Defaults to `kvSubject(model, workerId)`. */
  subject?: string;
  /** Batches kept for replay to servers (default 10000, vLLM's buffer_steps). */
  bufferBatches?: number;
  /** Most batches sent per replay answer when the request does not say (default 1000). */
  replayPage?: number;
  /** How long to wait for the engine's replay socket (default 2000 ms). */
  engineReplayTimeoutMs?: number;
  /**
   * The worker's relay epoch, shared by every DP rank's relay (default: a fresh one). Every
   * batch carries it; the registrar puts it in the record (`natsKvEpoch`).
   */
  epoch?: KvEpoch;
  /** Called after the engine's sequence went back (it restarted) and a new epoch began. */
  onEpochChange?: (epoch: string) => void;
  logger?: Logger;
}

/** One worker's epoch, shared by the relays of its ranks. */
export interface KvEpoch {
  value: string;
}

export interface KvRelayStats {
  relayed: number;
  /** Batches recovered from the engine's replay socket after a ZMQ gap. */
  recovered: number;
  /** Batches lost between engine and agent that replay could not recover. */
  lost: number;
  malformed: number;
  replaysServed: number;
}

export class NatsKvRelay {
  readonly subject: string;
  readonly replaySubject: string;
  readonly stats: KvRelayStats = { relayed: 0, recovered: 0, lost: 0, malformed: 0, replaysServed: 0 };
  private readonly ring: KvRing;
  private readonly sub = new Subscriber();
  private replaySub?: Subscription;
  private readonly log: Logger;
  /** Next seq expected from the engine (seq framing) or to assign (ATOM framing). */
  private expected: number;
  private closed = false;
  private loopDone?: Promise<void>;
  /** Relays of the worker's other DP ranks (this one relays the lowest). */
  readonly siblings: NatsKvRelay[] = [];
  /** Options of the sibling relays, one per other rank. */
  private readonly rankOpts: KvRelayOptions[] = [];
  private readonly o: KvRelayOptions;
  private readonly epochRef: KvEpoch;
  private hdrs: MsgHdrs;

  constructor(opts: KvRelayOptions) {
    this.epochRef = opts.epoch ?? { value: newKvEpoch() };
    const o: KvRelayOptions = { ...opts, epoch: this.epochRef };
    this.hdrs = epochHeaders(this.epochRef.value);
    const base = o.subject ?? kvSubject(o.model, o.workerId);
    const ranks = [...(o.events.ranks ?? [])].sort((a, b) => a.dpRank - b.dpRank);
    if (ranks.length > 0) {
      // This relay takes the lowest rank; the others get a relay each in start().
      const first = ranks[0];
      this.rankOpts = ranks.slice(1).map((r) => ({
        ...o,
        subject: kvRankSubject(base, r.dpRank),
        events: { ...o.events, endpoint: r.endpoint, replayEndpoint: r.replayEndpoint, ranks: undefined },
      }));
      this.o = {
        ...o,
        events: {
          ...o.events,
          endpoint: first.endpoint,
          replayEndpoint: first.replayEndpoint,
          ranks: undefined,
        },
      };
      this.subject = kvRankSubject(base, first.dpRank);
    } else {
      this.o = o;
      this.subject = base;
    }
    this.replaySubject = kvReplaySubject(this.subject);
    this.ring = new KvRing(o.bufferBatches ?? 10_000);
    this.log = o.logger ?? createLogger("nats-kv-relay", { worker: o.workerId });
    // Starting at 0 makes the first live batch pull whatever the engine published before the
    // agent subscribed (ZMQ subscribers miss those), so servers can replay full history.
    this.expected = 0;
  }

  /** The epoch stamped on every batch (the record's `natsKvEpoch`). */
  get epoch(): string {
    return this.epochRef.value;
  }

  /** Next sequence number the relay will publish. */
  get nextSeq(): number {
    return this.expected;
  }

  async start(): Promise<void> {
    for (const ro of this.rankOpts) {
      const r = new NatsKvRelay(ro);
      await r.start();
      this.siblings.push(r);
    }
    this.sub.connect(this.o.events.endpoint);
    this.sub.subscribe(this.o.events.topic ?? "");
    this.replaySub = this.o.nc.subscribe(this.replaySubject, {
      callback: (err, msg) => {
        if (!err) this.serveReplay(msg);
      },
    });
    await this.o.nc.flush();
    this.loopDone = this.loop();
  }

  async close(): Promise<void> {
    await Promise.all(this.siblings.map((r) => r.close()));
    this.closed = true;
    this.replaySub?.unsubscribe();
    this.sub.close();
    await this.loopDone?.catch(() => {});
  }

  private async loop(): Promise<void> {
    try {
      for await (const frames of this.sub) {
        if (this.closed) break;
        await this.onFrames(frames);
      }
    } catch (err) {
      if (!this.closed) this.log.warn({ err: String(err) }, "kv relay subscriber failed");
    }
  }

  private async onFrames(frames: Buffer[]): Promise<void> {
    if (this.o.events.framing === "atom") {
      // ATOM: [payload] or [topic, payload]; no sequence, so the relay numbers batches itself.
      const payload = frames[frames.length - 1];
      if (!payload || frames.length > 2) {
        this.stats.malformed++;
        return;
      }
      const seq = this.expected;
      this.emit(seq, seqFrame(seq), payload);
      return;
    }
    if (frames.length !== 3 || frames[1].length !== SEQ_BYTES) {
      this.stats.malformed++;
      return;
    }
    const seq = readKvSeq(frames[1])!;
    if (seq < 0) {
      this.stats.malformed++;
      return;
    }
    if (seq < this.expected && seq === 0) this.newEpoch();
    if (seq > this.expected) await this.recoverFromEngine(this.expected, seq);
    this.emit(seq, frames[1], frames[2]);
  }

  /**
   * The engine started its sequence again (it restarted under this agent): what servers hold
   * for this worker is stale. A new epoch, announced in the record by `onEpochChange`, is what
   * makes servers drop it; until then they refuse the new epoch's batches (never a reset from
   * an unannounced source).
   */
  private newEpoch(): void {
    this.epochRef.value = newKvEpoch();
    this.ring.clear();
    this.log.warn({ epoch: this.epochRef.value }, "engine kv sequence restarted; new relay epoch");
    this.o.onEpochChange?.(this.epochRef.value);
  }

  private headersNow(): MsgHdrs {
    if (this.hdrs.get(KV_EPOCH_HEADER) !== this.epochRef.value) this.hdrs = epochHeaders(this.epochRef.value);
    return this.hdrs;
  }

  private emit(seq: number, seqBytes: Uint8Array, payload: Uint8Array): void {
    const msg = encodeKvMessage(seqBytes, payload);
    this.ring.push(seq, msg);
    this.expected = seq + 1;
    this.stats.relayed++;
    try {
      this.o.nc.publish(this.subject, msg, { headers: this.headersNow() });
    } catch (err) {
      // Closed connection: the ring still has it for replay once servers ask.
      this.log.warn({ err: String(err) }, "kv relay publish failed");
    }
  }

  /** Fills [from, to) from the engine's replay socket; what it cannot get is counted as lost. */
  private async recoverFromEngine(from: number, to: number): Promise<void> {
    const ep = this.o.events.replayEndpoint;
    let got = from;
    if (ep) {
      const dealer = new Dealer({ receiveTimeout: this.o.engineReplayTimeoutMs ?? 2000, linger: 0 });
      try {
        dealer.connect(ep);
        await dealer.send([Buffer.alloc(0), seqFrame(from)]);
        for (;;) {
          const frames = await dealer.receive();
          // Replies are [b"", seq, payload]; some ROUTERs omit the empty delimiter.
          const off = frames.length >= 3 ? 1 : 0;
          const s = readKvSeq(frames[off] ?? Buffer.alloc(0));
          if (s === undefined || s < 0) break;
          if (s < got || s >= to) continue;
          const payload = frames[off + 1];
          if (!payload) break;
          this.emit(s, frames[off], payload);
          this.stats.recovered++;
          got = s + 1;
          if (got >= to) {
            // Drain the rest until the end marker would need another round trip; stop here.
            break;
          }
        }
      } catch (err) {
        this.log.warn({ err: String(err), from, to }, "engine kv replay failed");
      } finally {
        dealer.close();
      }
    }
    if (got < to) {
      this.stats.lost += to - got;
      if (from > 0 || this.stats.relayed > 0) {
        this.log.warn({ from: got, to }, "kv batches lost between engine and agent");
      }
    }
  }

  private serveReplay(msg: Msg): void {
    const reply = msg.reply;
    if (!reply) return;
    const req = decodeReplayRequest(msg.data);
    if (!req) return;
    const max = req.max > 0 ? req.max : (this.o.replayPage ?? 1000);
    this.stats.replaysServed++;
    try {
      const h = this.headersNow();
      this.ring.forEachFrom(req.start, max, (_seq, m) => this.o.nc.publish(reply, m, { headers: h }));
      this.o.nc.publish(reply, encodeReplayEnd(this.ring.oldest, this.expected), { headers: h });
    } catch (err) {
      this.log.warn({ err: String(err) }, "kv replay answer failed");
    }
  }
}

function epochHeaders(epoch: string): MsgHdrs {
  const h = headers();
  h.set(KV_EPOCH_HEADER, epoch);
  return h;
}

export async function startKvRelay(o: KvRelayOptions): Promise<NatsKvRelay> {
  const r = new NatsKvRelay(o);
  await r.start();
  return r;
}
