/**
 * The peer plane with `--event-plane nats` (src/router/peers): announcements on
 * `infera.route.<model>` (./subjects.ts) and load reports on `infera.route._.load`, every
 * replica subscribed to `infera.route.>`. Core NATS
 * (at most once): a frame published while a replica is disconnected is lost, which costs a
 * cache miss. Subject permissions on the broker say who may publish there; the sender id in
 * each frame still lets a replica skip its own.
 */
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { PeerTransport } from "../../router/peers/types.ts";
import { LOAD_SUBJECT, ROUTE_SUBJECT_PREFIX, routeSubject } from "./subjects.ts";

export class NatsPeerTransport implements PeerTransport {
  readonly kind = "nats" as const;
  readonly endpoint = `${ROUTE_SUBJECT_PREFIX}.>`;
  private readonly nc: NatsConnection;
  private readonly ownsConnection: boolean;
  private readonly sub: Subscription;
  private readonly maxPending: number;
  /** Frames received and not yet read; past maxPending new ones are dropped (as a PUB's HWM). */
  private pending: Uint8Array[] = [];
  private wake: (() => void) | null = null;
  private closed = false;

  constructor(nc: NatsConnection, ownsConnection: boolean, maxPending = 10_000) {
    this.nc = nc;
    this.ownsConnection = ownsConnection;
    this.maxPending = maxPending;
    this.sub = nc.subscribe(this.endpoint, {
      callback: (err, msg) => {
        if (err || this.closed || this.pending.length >= this.maxPending) return;
        this.pending.push(msg.data);
        this.wake?.();
      },
    });
  }

  publish(model: string | null, frame: Uint8Array): void {
    if (this.closed) return;
    try {
      this.nc.publish(model === null ? LOAD_SUBJECT : routeSubject(model), frame);
    } catch {
      // Closed or draining connection: the announcement is lost, as over a lossy plane.
    }
  }

  async *frames(): AsyncIterable<Uint8Array> {
    while (!this.closed) {
      if (this.pending.length === 0) {
        await new Promise<void>((r) => {
          this.wake = r;
        });
        this.wake = null;
        continue;
      }
      const batch = this.pending;
      this.pending = [];
      for (const f of batch) yield f;
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.wake?.();
    this.sub.unsubscribe();
    if (this.ownsConnection) await this.nc.close().catch(() => {});
  }
}
