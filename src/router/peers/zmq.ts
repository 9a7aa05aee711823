/**
 * The peer plane without NATS: a ZMQ PUB/SUB mesh. Each replica binds one PUB socket and
 * connects one SUB socket to every peer's PUB (ZMQ reconnects by itself when a peer restarts;
 * a peer that is down only means its announcements are missed). PUB drops frames past its
 * high-water mark instead of blocking, so a slow or absent peer never holds routing back.
 */
import { Publisher, Subscriber } from "zeromq";
import "../../util/zmq-limits.ts";
import type { PeerTransport } from "./types.ts";

export interface ZmqPeerOptions {
  /** Where this replica's PUB binds, e.g. tcp://127.0.0.1:7300 (port 0 or * = any free port). */
  bind: string;
  /** Peers' PUB endpoints (this replica's own may be among them: its frames are ignored). */
  connect: readonly string[];
  /** Frames queued per peer before new ones are dropped. */
  sendHighWaterMark?: number;
}

export class ZmqPeerTransport implements PeerTransport {
  readonly kind = "zmq" as const;
  private readonly pub: Publisher;
  private readonly sub: Subscriber;
  private bound = "";
  private readonly peers = new Set<string>();
  private sending = false;
  private queue: Uint8Array[] = [];
  private closed = false;
  private readonly o: ZmqPeerOptions;

  constructor(o: ZmqPeerOptions) {
    this.o = o;
    const hwm = o.sendHighWaterMark ?? 1000;
    this.pub = new Publisher({ linger: 0, sendHighWaterMark: hwm });
    this.sub = new Subscriber({ linger: 0, receiveHighWaterMark: 10 * hwm });
  }

  get endpoint(): string {
    return this.bound;
  }

  async start(): Promise<void> {
    const bind = this.o.bind.replace(/:0$/, ":*");
    await this.pub.bind(bind);
    this.bound = this.pub.lastEndpoint ?? bind;
    this.sub.subscribe();
    for (const p of this.o.connect) this.addPeer(p);
  }

  /** Follows one more peer (etcd discovery adds them as they register). */
  addPeer(endpoint: string): void {
    if (this.closed || this.peers.has(endpoint) || endpoint === this.bound) return;
    this.peers.add(endpoint);
    this.sub.connect(endpoint);
  }

  removePeer(endpoint: string): void {
    if (this.closed || !this.peers.delete(endpoint)) return;
    try {
      this.sub.disconnect(endpoint);
    } catch {
      // already gone
    }
  }

  publish(_model: string | null, frame: Uint8Array): void {
    if (this.closed) return;
    // zeromq.js takes one send at a time per socket; PUB never blocks, so the queue stays short.
    if (this.queue.length >= 1000) return;
    this.queue.push(frame);
    if (!this.sending) void this.drain();
  }

  private async drain(): Promise<void> {
    this.sending = true;
    try {
      while (this.queue.length > 0 && !this.closed) {
        const f = this.queue.shift()!;
        await this.pub.send(f).catch(() => {});
      }
    } finally {
      this.sending = false;
    }
  }

  async *frames(): AsyncIterable<Uint8Array> {
    try {
      for await (const [frame] of this.sub) yield frame;
    } catch (err) {
      if (!this.closed) throw err;
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.queue = [];
    this.pub.close();
    this.sub.close();
  }
}
