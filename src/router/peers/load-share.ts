/**
 * One scrape of each engine's `/metrics` shared among server replicas (issue #32: adding
 * replicas must not multiply the load on engines).
 *
 * - **Who is live**: every replica whose scraper runs reports every scrape tick (its readings,
 *   or none: the report is its heartbeat too); a peer counts as live for `LIVE_PERIODS` of its
 *   period after its last report. This replica is always live to itself.
 * - **Who scrapes what**: rendezvous (highest-random-weight) hashing of the worker id over the
 *   live replicas' ids: every replica that knows the same live set picks the same owner without
 *   talking, and a replica joining or leaving moves only its own share of the workers.
 * - **Readings**: the owner reports each reading with its age; the others file it as the worker's
 *   `engineLoad`, dated on their own clock (src/server/load-scraper.ts).
 * - **Busy hints**: a report lists the workers its sender has requests in flight on, so their
 *   owner scrapes them at the busy pace although it sends them nothing.
 *
 * The owner gone (no report for `LIVE_PERIODS` periods, or at once when it says goodbye as its
 * server closes): the hash over the remaining live set names another at its next tick. Readings of a worker stop although its owner is live (it does
 * not know the worker, its scrapes fail): the scraper scrapes it itself (load-scraper.ts).
 */
import { createHash } from "node:crypto";
import { Counter, type Registry } from "prom-client";
import { encodeLoadReport, type LoadReading, type LoadReport, MAX_BUSY, MAX_READINGS } from "./load-wire.ts";
import type { DropReason, ScrapedReading, SharedLoad } from "./types.ts";

/** A peer counts as live for this many of its report periods after its last report. */
export const LIVE_PERIODS = 3;
/** A peer's claimed period is honoured up to this (it cannot stay live longer by claiming more). */
const MAX_PERIOD_MS = 30_000;
/** Live peers at most (reports from more new senders are refused: `full`). */
const MAX_REPLICAS = 256;
/** Busy hints and cached owners kept at most (beyond, the expired / all are forgotten). */
const MAX_WORKERS = 65_536;

export interface LoadShareOptions {
  replicaId: string;
  secret: Buffer | null;
  /** The mesh's next sequence number (one counter for every frame a replica sends). */
  nextSeq: () => number;
  /** Sends one frame to every peer. */
  send: (frame: Uint8Array) => void;
  registry: Registry;
  now?: () => number;
}

/** The rendezvous weight of `replica` for `worker`: 48 bits of SHA-256, the same in every process. */
function weight(replica: string, worker: string): number {
  return createHash("sha256").update(replica).update("\0").update(worker).digest().readUIntBE(0, 6);
}

export class LoadShare implements SharedLoad {
  readonly replicaId: string;
  onReadings: ((readings: readonly ScrapedReading[]) => void) | null = null;
  private readonly o: LoadShareOptions;
  private readonly now: () => number;
  /** Live peers: until when each counts (local ms). */
  private readonly live = new Map<string, number>();
  /** Workers peers have requests in flight on: until when (local ms). */
  private readonly busy = new Map<string, number>();
  /** Owner per worker over the current live set (cleared when the set changes). */
  private owners = new Map<string, string>();
  private readonly readings: Counter<"direction">;

  constructor(o: LoadShareOptions) {
    this.o = o;
    this.replicaId = o.replicaId;
    this.now = o.now ?? Date.now;
    const name = "infera_peer_load_readings_total";
    this.readings =
      (o.registry.getSingleMetric(name) as Counter<"direction"> | undefined) ??
      new Counter({
        name,
        help: "Engine load readings shared among replicas: sent (this replica scraped them), received (a peer's, filed instead of a scrape)",
        labelNames: ["direction"],
        registers: [o.registry],
      });
  }

  /** The replicas this one counts as live, itself included, sorted (tests, debugging). */
  liveReplicas(): string[] {
    this.prune();
    return [this.replicaId, ...this.live.keys()].sort();
  }

  liveCount(): number {
    this.prune();
    return 1 + this.live.size;
  }

  /** The live replica that scrapes `workerId`. */
  ownerOf(workerId: string): string {
    this.prune();
    let owner = this.owners.get(workerId);
    if (owner !== undefined) return owner;
    owner = this.replicaId;
    let best = weight(owner, workerId);
    for (const r of this.live.keys()) {
      const w = weight(r, workerId);
      if (w > best || (w === best && r < owner)) {
        best = w;
        owner = r;
      }
    }
    if (this.owners.size >= MAX_WORKERS) this.owners.clear();
    this.owners.set(workerId, owner);
    return owner;
  }

  isMine(workerId: string): boolean {
    return this.ownerOf(workerId) === this.replicaId;
  }

  busyElsewhere(workerId: string): boolean {
    const until = this.busy.get(workerId);
    return until !== undefined && until > this.now();
  }

  report(readings: readonly ScrapedReading[], busy: readonly string[], periodMs: number): void {
    const sentAt = this.now();
    let r = 0;
    let b = 0;
    // At least one frame (the heartbeat); longer lists over several, each within the bounds.
    do {
      const part: LoadReading[] = readings.slice(r, r + MAX_READINGS).map((x) => {
        const { scrapedAt, ...rest } = x;
        return { ...rest, ageMs: Math.max(0, sentAt - scrapedAt) };
      });
      const frame: LoadReport = {
        sender: this.replicaId,
        seq: this.o.nextSeq(),
        sentAt,
        periodMs: Math.max(1, Math.round(periodMs)),
        readings: part,
        busy: busy.slice(b, b + MAX_BUSY),
      };
      this.o.send(encodeLoadReport(frame, this.o.secret));
      r += MAX_READINGS;
      b += MAX_BUSY;
    } while (r < readings.length || b < busy.length);
    if (readings.length > 0) this.readings.inc({ direction: "sent" }, readings.length);
  }

  leave(): void {
    const frame: LoadReport = {
      sender: this.replicaId,
      seq: this.o.nextSeq(),
      sentAt: this.now(),
      periodMs: 1,
      readings: [],
      busy: [],
      bye: true,
    };
    this.o.send(encodeLoadReport(frame, this.o.secret));
  }

  /**
   * Files a peer's report (checked by the mesh: signature, shape, sender, sequence). Returns why
   * it was not taken, or null.
   */
  receive(rep: LoadReport): DropReason | null {
    const now = this.now();
    const window = LIVE_PERIODS * Math.min(rep.periodMs, MAX_PERIOD_MS);
    // In transit longer than the sender stays live: a replay, or a queue that held it too long.
    const transit = now - rep.sentAt;
    if (rep.bye) {
      if (this.live.delete(rep.sender)) this.owners.clear();
      return null;
    }
    if (transit > window) return "stale";
    if (!this.live.has(rep.sender)) {
      if (this.live.size >= MAX_REPLICAS) return "full";
      this.owners.clear();
    }
    this.live.set(rep.sender, now + window);
    if (rep.busy.length > 0) {
      if (this.busy.size + rep.busy.length > MAX_WORKERS) this.pruneBusy(now);
      for (const id of rep.busy)
        if (this.busy.size < MAX_WORKERS || this.busy.has(id)) this.busy.set(id, now + window);
    }
    if (rep.readings.length === 0) return null;
    // Dated on this clock: its age at sending plus the transit (at most one period: a skewed
    // clock neither ages nor freshens it past that).
    const lag = Math.min(Math.max(0, transit), rep.periodMs);
    const filed: ScrapedReading[] = rep.readings.map(({ ageMs, ...x }) => ({
      ...x,
      scrapedAt: now - lag - ageMs,
    }));
    this.readings.inc({ direction: "received" }, filed.length);
    this.onReadings?.(filed);
    return null;
  }

  /** Forgets peers past their live window (the owners over the new set are recomputed). */
  private prune(): void {
    if (this.live.size === 0) return;
    const now = this.now();
    let changed = false;
    for (const [r, until] of this.live)
      if (until <= now) {
        this.live.delete(r);
        changed = true;
      }
    if (changed) this.owners.clear();
  }

  private pruneBusy(now: number): void {
    for (const [id, until] of this.busy) if (until <= now) this.busy.delete(id);
  }
}
