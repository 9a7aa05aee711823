/**
 * A minimal vLLM-style KV event publisher for relay tests: PUB `[topic, seq, payload]` and a
 * ROUTER replay socket, with a switch to withhold a batch from the live socket (as a ZMQ drop).
 * The PUB is an XPUB, so a test can wait for its subscriber (`subscribed()`, ../../helpers/xpub.ts)
 * rather than sleep while the SUB "joins"; its send high-water mark is vLLM's (VLLM_PUB_HWM).
 */
import { pack } from "msgpackr";
import { Router } from "zeromq";
import { storedWire } from "../../helpers/kv-events.ts";
import { freePort } from "../../helpers/ports.ts";
import { VLLM_PUB_HWM, watchedPublisher } from "../../helpers/xpub.ts";

export class FakeKvEngine {
  private readonly watched = watchedPublisher(VLLM_PUB_HWM);
  readonly pub = this.watched.pub;
  readonly router = new Router({ linger: 0 });
  readonly sent: { seq: number; payload: Buffer }[] = [];
  endpoint = "";
  replayEndpoint = "";
  private seq = 0;

  async start(): Promise<void> {
    this.endpoint = `tcp://127.0.0.1:${await freePort()}`;
    this.replayEndpoint = `tcp://127.0.0.1:${await freePort()}`;
    await this.pub.bind(this.endpoint);
    await this.router.bind(this.replayEndpoint);
    void this.serveReplay();
  }

  /** Resolves once `n` subscriptions in all have reached this PUB. */
  subscribed(n = 1, ms = 10_000): Promise<void> {
    return this.watched.watch.subscribed(n, ms);
  }

  /** A BlockStored batch for `tokens` (one block), as vLLM's positional encoding. */
  static batch(hash: number, parent: number | null, tokens: number[]): Buffer {
    return pack([Date.now() / 1000, [storedWire([hash], parent, tokens, tokens.length)], 0]);
  }

  async publish(payload: Buffer, opts: { drop?: boolean } = {}): Promise<number> {
    const seq = this.seq++;
    this.sent.push({ seq, payload });
    if (!opts.drop) await this.pub.send(["kv", seqBuf(seq), payload]);
    return seq;
  }

  private async serveReplay(): Promise<void> {
    try {
      for await (const [id, , start] of this.router) {
        const from = Number(start.readBigInt64BE(0));
        for (const b of this.sent)
          if (b.seq >= from) await this.router.send([id, "", seqBuf(b.seq), b.payload]);
        await this.router.send([id, "", seqBuf(-1), ""]);
      }
    } catch {
      // closed
    }
  }

  close(): void {
    this.pub.close();
    this.router.close();
  }
}

export function seqBuf(seq: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(BigInt(seq));
  return b;
}
