/**
 * A replica's peer plane over one transport: signs and sends this replica's announcements,
 * checks and files the peers' ones into per-model tables, and counts both.
 *
 * Checks on arrival, in order: the frame's MAC (with a secret) → `auth`; the shape →
 * `malformed`; our own sender id → ignored (our own bridge holds it); a sequence number not
 * above the sender's last → `replay`; an age past the announcement's TTL → `stale`; no room →
 * `full`. A lost announcement costs a cache miss and nothing else.
 *
 * The same frames carry load reports (./load-share.ts, one engine scrape shared among replicas):
 * the same MAC, shape and sequence checks, then filed there (`stale`: past the sender's live
 * window; `full`: too many live senders).
 */
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { Counter, Histogram, type Registry } from "prom-client";
import type { Logger } from "../../util/log.ts";
import { LoadShare } from "./load-share.ts";
import { isLoadReport, parseLoadReport } from "./load-wire.ts";
import { digest, digestDense, PeerTable } from "./table.ts";
import type { DropReason, PeerPlane, PeerRouting, PeerTransport } from "./types.ts";
import { encodeAnnouncement, openFrame, parseAnnouncement } from "./wire.ts";

export interface PeerMeshOptions {
  transport: PeerTransport;
  /** Shared secret: announcements are signed and only signed ones are taken. */
  secret: Buffer | null;
  ttlMs: number;
  /** Path nodes an announcement carries at most (a prefix-preserving digest beyond). */
  maxNodes: number;
  maxEntriesPerWorker: number;
  /** Entries per model, all workers together. */
  maxEntries: number;
  registry: Registry;
  logger: Logger;
  replicaId?: string;
  now?: () => number;
  /** Run at close, after the transport (e.g. leaving the etcd peer directory). */
  onClose?: () => Promise<void>;
  /** Share one engine scrape among replicas (./load-share.ts); default true. */
  shareLoad?: boolean;
}

/** Models with a table at most (announcements name models; a flood of names is refused). */
const MAX_MODELS = 256;
/** Senders whose last sequence number is remembered (the oldest is forgotten first). */
const MAX_SENDERS = 4096;

/** A replica id unique across hosts and restarts (a restarted replica's sequence starts again). */
export function newReplicaId(): string {
  return `${hostname()}-${process.pid}-${randomBytes(4).toString("hex")}`;
}

export class PeerMesh implements PeerPlane {
  readonly replicaId: string;
  readonly load: LoadShare | null;
  private readonly o: PeerMeshOptions;
  private readonly now: () => number;
  private readonly tables = new Map<string, PeerTable>();
  private readonly lastSeq = new Map<string, number>();
  private seq = 0;
  private closed = false;
  private loop: Promise<void> | null = null;
  private readonly sent: Counter<"transport">;
  private readonly received: Counter<"transport">;
  private readonly dropped: Counter<"reason">;
  private readonly age: Histogram;
  private readonly retracted: Counter<"direction">;

  constructor(o: PeerMeshOptions) {
    this.o = o;
    this.now = o.now ?? Date.now;
    this.replicaId = o.replicaId ?? newReplicaId();
    const reg = [o.registry];
    const counter = <L extends string>(name: string, help: string, labelNames: L[]) =>
      (o.registry.getSingleMetric(name) as Counter<L> | undefined) ??
      new Counter({ name, help, labelNames, registers: reg });
    this.sent = counter("infera_peer_announcements_sent_total", "Routing announcements sent to peers", [
      "transport",
    ]);
    this.received = counter(
      "infera_peer_announcements_received_total",
      "Peers' routing announcements taken",
      ["transport"],
    );
    this.dropped = counter(
      "infera_peer_announcements_dropped_total",
      "Peers' frames (routing announcements, load reports) not taken, by reason (auth, malformed, stale, replay, full)",
      ["reason"],
    );
    this.retracted = counter(
      "infera_peer_retractions_total",
      "Retractions of routing announcements: sent (this replica's bridge entry ended), applied (a peer's entry taken out before its TTL)",
      ["direction"],
    );
    this.age =
      (o.registry.getSingleMetric("infera_peer_announcement_age_seconds") as Histogram | undefined) ??
      new Histogram({
        name: "infera_peer_announcement_age_seconds",
        help: "Age of peers' routing announcements on arrival (sender's clock to ours)",
        buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
        registers: reg,
      });
    this.load =
      o.shareLoad === false
        ? null
        : new LoadShare({
            replicaId: this.replicaId,
            secret: o.secret,
            nextSeq: () => ++this.seq,
            send: (frame) => {
              if (!this.closed) o.transport.publish(null, frame);
            },
            registry: o.registry,
            now: this.now,
          });
  }

  get endpoint(): string {
    return this.o.transport.endpoint;
  }

  /** Starts taking peers' announcements. */
  start(): void {
    this.loop ??= (async () => {
      try {
        for await (const frame of this.o.transport.frames()) {
          if (this.closed) break;
          this.receive(frame);
        }
      } catch (err) {
        if (!this.closed) this.o.logger.warn({ err: String(err) }, "peer plane: receive loop ended");
      }
    })();
  }

  forModel(model: string): PeerRouting {
    return {
      announce: (workerId, path, tokens) => this.announce(model, workerId, path, tokens),
      retract: (workerId, path) => this.announce(model, workerId, path, 0, true),
      match: (workerId, path) => this.tables.get(model)?.match(workerId, path) ?? 0,
    };
  }

  /** The table of a model (tests). */
  table(model: string): PeerTable | undefined {
    return this.tables.get(model);
  }

  /** Announces `path` routed to `worker`, or with `end` retracts that announcement. */
  announce(model: string, worker: string, path: readonly number[], tokens: number, end = false): void {
    if (this.closed || path.length === 0) return;
    const frame = encodeAnnouncement(
      {
        sender: this.replicaId,
        seq: ++this.seq,
        sentAt: this.now(),
        model,
        worker,
        tokens,
        ttlMs: this.o.ttlMs,
        nodes: digest(path, this.o.maxNodes),
        ...(end ? { end: true } : {}),
      },
      this.o.secret,
    );
    this.o.transport.publish(model, frame);
    if (end) this.retracted.inc({ direction: "sent" });
    else this.sent.inc({ transport: this.o.transport.kind });
  }

  /** Checks and files one frame from a peer. */
  receive(frame: Uint8Array): void {
    const o = openFrame(frame, this.o.secret);
    if (!o.ok) {
      this.drop(o.reason);
      return;
    }
    if (isLoadReport(o.v)) {
      this.receiveLoad(o.v);
      return;
    }
    const d = parseAnnouncement(o.v);
    if (!d.ok) {
      this.drop(d.reason);
      return;
    }
    const a = d.a;
    if (a.sender === this.replicaId) return;
    if (!this.inSequence(a.sender, a.seq)) {
      this.drop("replay");
      return;
    }
    const now = this.now();
    const ageMs = Math.max(0, now - a.sentAt);
    this.age.observe(ageMs / 1000);
    // The TTL counts from sending; never longer than ours (a peer cannot pin entries here).
    const ttl = Math.min(a.ttlMs, this.o.ttlMs);
    if (ageMs >= ttl) {
      this.drop("stale");
      return;
    }
    if (a.end) {
      // A retraction: nothing to file, only an entry to take out (it may have expired already).
      if (this.tables.get(a.model)?.retract(a.worker, a.nodes)) this.retracted.inc({ direction: "applied" });
      return;
    }
    let t = this.tables.get(a.model);
    if (!t) {
      if (this.tables.size >= MAX_MODELS) {
        this.drop("full");
        return;
      }
      t = new PeerTable({
        maxEntriesPerWorker: this.o.maxEntriesPerWorker,
        maxEntries: this.o.maxEntries,
        denseNodes: digestDense(this.o.maxNodes),
        now: this.now,
      });
      this.tables.set(a.model, t);
    }
    const nodes = a.nodes.length > this.o.maxNodes ? a.nodes.subarray(0, this.o.maxNodes) : a.nodes;
    const full = t.add(a.worker, nodes, a.sentAt + ttl);
    this.received.inc({ transport: this.o.transport.kind });
    if (full > 0) this.dropped.inc({ reason: "full" }, full);
  }

  /** A load report (./load-share.ts): the same sender and sequence checks, then filed there. */
  private receiveLoad(v: unknown[]): void {
    const d = parseLoadReport(v);
    if (!d.ok) {
      this.drop(d.reason);
      return;
    }
    const r = d.r;
    if (r.sender === this.replicaId) return;
    // Reports keep their own sequence per sender: over NATS they travel on another subject
    // than the announcements, so the two kinds need not arrive in sending order.
    if (!this.inSequence(`load\0${r.sender}`, r.seq)) {
      this.drop("replay");
      return;
    }
    if (!this.load) return;
    const why = this.load.receive(r);
    if (why) this.drop(why);
  }

  /** Whether `seq` is above the sender's last (then it becomes the last). */
  private inSequence(sender: string, seq: number): boolean {
    const last = this.lastSeq.get(sender);
    if (last !== undefined && seq <= last) return false;
    this.lastSeq.delete(sender);
    this.lastSeq.set(sender, seq);
    if (this.lastSeq.size > MAX_SENDERS) this.lastSeq.delete(this.lastSeq.keys().next().value as string);
    return true;
  }

  private drop(reason: DropReason): void {
    this.dropped.inc({ reason });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.o.onClose?.();
    await this.o.transport.close();
    await this.loop;
  }
}
