import { Counter, Gauge, type Registry } from "prom-client";
import type { EventBatch } from "./event-model.ts";

/** Counters of KV event ingestion, registered on the service's own Registry. */
export class KvIngestMetrics {
  readonly batches: Counter<"worker">;
  readonly events: Counter<"type">;
  readonly malformed: Counter<"worker">;
  readonly replays: Counter<"result">;
  readonly resets: Counter<"reason">;
  readonly sequence: Counter<"kind">;
  readonly capped: Counter<"worker">;
  readonly refused: Counter<"worker" | "reason">;
  readonly workers: Gauge;
  /**
   * Applied batches and events counted here and added to the two counters when they are read
   * (their `collect`), not per batch: a labelled `inc()` hashes its labels each time, which at
   * 200k batches/s is a sizeable part of a core. Reads see exact counts.
   */
  private readonly pendingBatches = new Map<string, number>();
  private pendingEvents: Record<string, number> = {};

  constructor(registry: Registry) {
    const registers = [registry];
    const flush = () => this.flush();
    this.batches = new Counter({
      name: "infera_kv_event_batches_total",
      help: "KV event batches applied to the index",
      labelNames: ["worker"],
      registers,
      collect: flush,
    });
    this.events = new Counter({
      name: "infera_kv_events_total",
      help: "KV events applied to the index, by type",
      labelNames: ["type"],
      registers,
      collect: flush,
    });
    this.malformed = new Counter({
      name: "infera_kv_malformed_messages_total",
      help: "KV event messages or events that could not be decoded",
      labelNames: ["worker"],
      registers,
    });
    this.replays = new Counter({
      name: "infera_kv_replays_total",
      help: "Replay requests to engines' replay sockets, by result (ok, incomplete, failed)",
      labelNames: ["result"],
      registers,
    });
    this.resets = new Counter({
      name: "infera_kv_worker_resets_total",
      help: "Worker ranks reset to empty in the index, by reason (gap, jump, restart, epoch)",
      labelNames: ["reason"],
      registers,
    });
    this.sequence = new Counter({
      name: "infera_kv_sequence_anomalies_total",
      help:
        "KV event sequence anomalies by kind: gap (missed batches, replayed), jump (a gap replay " +
        "could not fill), backward (live seq went back: engine restart), restart (a replayed seq " +
        "came again with other bytes: engine restart), reconnect (the PUB connection dropped and the " +
        "replay buffer no longer holds our last batch: engine restart), epoch (SGLang epoch changed)",
      labelNames: ["kind"],
      registers,
    });
    this.capped = new Counter({
      name: "infera_kv_index_dropped_blocks_total",
      help: "Stored blocks not indexed because the worker rank was at its cap (kvBlocks + margin)",
      labelNames: ["worker"],
      registers,
    });
    this.refused = new Counter({
      name: "infera_kv_refused_batches_total",
      help:
        "KV event batches refused, not applied, by reason: epoch (not stamped with the relay epoch " +
        "the worker's record announces) or restart (a sequence restart no new record announced)",
      labelNames: ["worker", "reason"],
      registers,
    });
    this.workers = new Gauge({
      name: "infera_kv_subscribed_workers",
      help: "Workers whose KV events this server subscribes to",
      registers,
    });
  }

  /** One batch applied for `worker`: counts it and its events by type. */
  applied(worker: string, batch: EventBatch): void {
    this.pendingBatches.set(worker, (this.pendingBatches.get(worker) ?? 0) + 1);
    const ev = this.pendingEvents;
    for (const e of batch.events) ev[e.type] = (ev[e.type] ?? 0) + 1;
  }

  private flush(): void {
    for (const [worker, n] of this.pendingBatches) this.batches.inc({ worker }, n);
    this.pendingBatches.clear();
    const ev = this.pendingEvents;
    this.pendingEvents = {};
    for (const type in ev) this.events.inc({ type }, ev[type]);
  }
}
