import { Packr } from "msgpackr";
import { Publisher, Router } from "zeromq";
import type { Logger } from "../../util/log.ts";
import type { KvEventsConfig, KvEventsFraming } from "./config.ts";
import type { KvEvent } from "./kv-events.ts";
import { encodeBatch, type KvLayout } from "./kv-layouts.ts";

export type { KvLayout };

/**
 * vLLM's ZMQ KV-event publisher: a PUB socket sending `[topic, seq (8-byte BE), msgpack
 * EventBatch]`, EventBatch = `[ts, [events...], data_parallel_rank]`, and a ROUTER on the
 * replay endpoint answering `[identity, "", start_seq]` with every buffered batch whose seq
 * >= start_seq, then `[identity, "", -1, ""]`.
 *
 * The replay, as vllm-project/vllm vllm/distributed/kv_events.py at 0181ea3173e5 has it
 * (`ZmqEventPublisher`; SGLang's python/sglang/srt/disaggregation/kv_events.py at 006d053f182f
 * is the same code): the buffer is a `deque(maxlen=buffer_steps)` (default 10,000) of the last
 * published batches, one per step with events, as `(seq, payload)`; a request of any other
 * frame count is logged and not answered; `start_seq` is `int.from_bytes(frame, "big")`
 * (unsigned, any length); a start older than the buffer gets the whole buffer (its first reply
 * is above the seq asked for). All replies are sent in one go on a ROUTER with libzmq's default
 * send high-water mark (1000): past it, replies to a slow reader are dropped, as on the engine.
 *
 * Block hashes are msgpack integers (uint64, or int64 when below 2^63): decode them with
 * msgpackr's `int64AsType: "bigint"` (or "string") to keep every bit.
 */
const END_SEQ = (() => {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(-1n);
  return b;
})();

/** Python's `int.from_bytes(b, "big")`: unsigned, any length (an empty frame is 0). */
export function startSeqOf(b: Uint8Array): bigint {
  let v = 0n;
  for (const x of b) v = (v << 8n) | BigInt(x);
  return v;
}

export class KvEventPublisher {
  private readonly cfg: KvEventsConfig;
  private readonly layout: KvLayout;
  private readonly framing: KvEventsFraming;
  private readonly dpRank: number;
  private readonly log: Logger;
  private readonly pub: Publisher;
  private readonly replay: Router | null;
  private readonly packr = new Packr({ useRecords: false, variableMapSize: true });
  private readonly topic: Buffer;
  private seq = 0n;
  /** Ring of the last buffer_steps batches for replay; `ringStart` is the oldest. */
  private readonly ring: { seq: Buffer; payload: Buffer }[] = [];
  private ringStart = 0;
  private readonly queue: Buffer[][] = [];
  private sending = false;
  private closed = false;

  constructor(cfg: KvEventsConfig, layout: KvLayout, framing: KvEventsFraming, dpRank: number, log: Logger) {
    this.cfg = cfg;
    this.layout = layout;
    this.framing = framing;
    this.dpRank = dpRank;
    this.log = log;
    this.pub = new Publisher({ sendHighWaterMark: cfg.hwm, linger: 0 });
    this.replay =
      cfg.replay_endpoint && framing === "seq" ? new Router({ linger: 0, sendHighWaterMark: 1000 }) : null;
    this.topic = Buffer.from(cfg.topic);
  }

  /**
   * Binds both sockets; returns the endpoints actually bound (ZMQ's `tcp://host:*` picks a
   * free port, which `lastEndpoint` then names).
   */
  async start(
    endpoint: string,
    replayEndpoint: string | null,
    mode: "bind" | "connect" = "bind",
  ): Promise<{ pub: string; replay: string | null }> {
    // "connect": the engine's heuristic chose connect() for a non-wildcard host, so nothing
    // listens on the endpoint (subscribers never hear it), as on the real engine.
    if (mode === "connect") this.pub.connect(endpoint);
    else await this.pub.bind(endpoint);
    let replay: string | null = null;
    if (this.replay && replayEndpoint) {
      await this.replay.bind(replayEndpoint);
      replay = this.replay.lastEndpoint ?? replayEndpoint;
      void this.serveReplay(this.replay);
    }
    return { pub: (mode === "bind" ? this.pub.lastEndpoint : null) ?? endpoint, replay };
  }

  /** Publishes one step's events as one batch. */
  publish(events: readonly KvEvent[]): void {
    if (this.closed || events.length === 0) return;
    const payload = this.packr.pack(encodeBatch(this.layout, Date.now() / 1000, events, this.dpRank));
    const seq = Buffer.allocUnsafe(8);
    seq.writeBigUInt64BE(this.seq++);
    const entry = { seq, payload };
    if (this.ring.length < this.cfg.buffer_steps) this.ring.push(entry);
    else if (this.ring.length > 0) {
      this.ring[this.ringStart] = entry;
      this.ringStart = (this.ringStart + 1) % this.ring.length;
    }
    if (this.framing !== "seq") this.queue.push(this.topic.length > 0 ? [this.topic, payload] : [payload]);
    else this.queue.push([this.topic, seq, payload]);
    if (!this.sending) void this.drain();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.pub.close();
    this.replay?.close();
  }

  private async drain(): Promise<void> {
    this.sending = true;
    try {
      while (this.queue.length > 0 && !this.closed) {
        const msg = this.queue.shift()!;
        await this.pub.send(msg);
      }
    } catch (err) {
      if (!this.closed) this.log.warn({ err }, "kv event publish failed");
    } finally {
      this.sending = false;
    }
  }

  private async serveReplay(sock: Router): Promise<void> {
    try {
      for await (const frames of sock) {
        // vLLM answers only `[identity, b"", start_seq]`; anything else is logged and gets no
        // reply at all (not even the end marker).
        if (frames.length !== 3) {
          this.log.warn({ frames: frames.length }, "bad kv replay request");
          continue;
        }
        const id = frames[0];
        const start = startSeqOf(frames[2]);
        const buffered = [...this.ring.slice(this.ringStart), ...this.ring.slice(0, this.ringStart)];
        for (const b of buffered) {
          if (b.seq.readBigUInt64BE(0) >= start) await sock.send([id, "", b.seq, b.payload]);
        }
        await sock.send([id, "", END_SEQ, ""]);
      }
    } catch (err) {
      if (!this.closed) this.log.warn({ err }, "kv replay socket failed");
    }
  }
}
