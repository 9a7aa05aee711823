/**
 * A vLLM-style KV event publisher for tests: a real ZMQ PUB socket sending
 * [topic, seq, msgpack batch] and a real ROUTER replay socket over its buffer. `drop` publishes
 * nothing but still consumes a sequence number, as when the subscriber misses a message.
 *
 * The PUB is an XPUB, so the test can wait for each subscription to arrive (`subscribed()`,
 * ../helpers/xpub.ts) rather than sleep while the SUB "joins".
 *
 * The PUB's send high-water mark is vLLM's (VLLM_PUB_HWM, ../helpers/xpub.ts).
 */
import { Packr } from "msgpackr";
import { Router, type XPublisher } from "zeromq";
import { encodeSeq } from "../../src/kv/events.ts";
import { freePort } from "../helpers/ports.ts";
import { type SubscriptionWatch, VLLM_PUB_HWM, watchedPublisher } from "../helpers/xpub.ts";

const packr = new Packr({ useRecords: false });

export class FakePublisher {
  readonly topic;
  private readonly pub: XPublisher;
  private readonly watch: SubscriptionWatch;
  private readonly router = new Router({ linger: 0 });
  private seq = 0;
  readonly buffer: { seq: number; payload: Buffer }[] = [];
  endpoint = "";
  replayEndpoint = "";
  private serving: Promise<void> | null = null;
  private closed = false;
  /** Keep only the last N batches for replay (engine's buffer_steps). */
  bufferSteps = 10000;
  /**
   * Replies to leave out, as a ROUTER past its send high-water mark drops them: (seq, or -1
   * for the end marker; the request's number from 0) → true to drop.
   */
  dropReply: ((seq: number, request: number) => boolean) | null = null;
  /** Leave replay requests unanswered (an engine whose replay stalls). */
  silent = false;
  /** Replay requests received. */
  requests = 0;

  constructor(topic = "kv-events") {
    this.topic = topic;
    ({ pub: this.pub, watch: this.watch } = watchedPublisher(VLLM_PUB_HWM));
  }

  /** Binds fresh ports, or the given endpoints (an engine restarted on the same sockets). */
  async start(at?: { endpoint: string; replayEndpoint: string }): Promise<void> {
    if (at) {
      this.endpoint = at.endpoint;
      this.replayEndpoint = at.replayEndpoint;
    } else {
      this.endpoint = `tcp://127.0.0.1:${await freePort()}`;
      this.replayEndpoint = `tcp://127.0.0.1:${await freePort()}`;
    }
    await bindRetrying(this.pub, this.endpoint);
    await bindRetrying(this.router, this.replayEndpoint);
    this.serving = this.serveReplay();
  }

  /** Resolves once `n` subscriptions in all have reached this PUB (see ../helpers/xpub.ts). */
  subscribed(n = 1, ms = 10_000): Promise<void> {
    return this.watch.subscribed(n, ms);
  }

  /** Publishes one batch of events (array-encoded unless `mapEncoding`). */
  async publish(events: unknown[], opts: { drop?: boolean; topic?: string } = {}): Promise<number> {
    const seq = this.seq++;
    const payload = packr.pack([Date.now() / 1000, events, null]);
    this.buffer.push({ seq, payload });
    while (this.buffer.length > this.bufferSteps) this.buffer.shift();
    if (!opts.drop) await this.pub.send([opts.topic ?? this.topic, encodeSeq(seq), payload]);
    return seq;
  }

  /** Sends a buffered batch again on the PUB socket, bytes unchanged (a late live copy). */
  async resend(seq: number): Promise<void> {
    const b = this.buffer.find((x) => x.seq === seq);
    if (b) await this.pub.send([this.topic, encodeSeq(b.seq), b.payload]);
  }

  /** ATOM framing: no sequence frame, `[topic, payload]` (or `[payload]` with an empty topic). */
  async publishAtom(events: unknown[]): Promise<void> {
    const payload = packr.pack([Date.now() / 1000, events]);
    await this.pub.send(this.topic ? [this.topic, payload] : [payload]);
  }

  async sendRaw(frames: (Buffer | string)[]): Promise<void> {
    await this.pub.send(frames);
  }

  private async serveReplay(): Promise<void> {
    while (!this.closed) {
      let frames: Buffer[];
      try {
        frames = await this.router.receive();
      } catch {
        return;
      }
      const [id, , start] = frames;
      const request = this.requests++;
      if (this.silent) continue;
      const from = Number(start.readBigInt64BE());
      const drop = this.dropReply;
      for (const b of this.buffer)
        if (b.seq >= from && !drop?.(b.seq, request))
          await this.router.send([id, Buffer.alloc(0), encodeSeq(b.seq), b.payload]);
      if (!drop?.(-1, request)) await this.router.send([id, Buffer.alloc(0), encodeSeq(-1), Buffer.alloc(0)]);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.pub.close();
    this.router.close();
    await this.serving;
  }
}

/** Binds, retrying while a just-closed socket (an engine "restart") still holds the port. */
async function bindRetrying(sock: XPublisher | Router, endpoint: string): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      await sock.bind(endpoint);
      return;
    } catch (err) {
      if (i >= 50 || !/in use/i.test(String(err))) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

export async function waitFor(cond: () => boolean, ms = 5000, what = "condition"): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
