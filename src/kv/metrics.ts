import { Counter, Gauge, type Registry } from "prom-client";

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

  constructor(registry: Registry) {
    const registers = [registry];
    this.batches = new Counter({
      name: "infera_kv_event_batches_total",
      help: "KV event batches applied to the index",
      labelNames: ["worker"],
      registers,
    });
    this.events = new Counter({
      name: "infera_kv_events_total",
      help: "KV events applied to the index, by type",
      labelNames: ["type"],
      registers,
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
}
