/**
 * What every KV event feed is, whichever plane carries it (ZMQ: ./zmq.ts, NATS: ./nats.ts with
 * its wire in src/transport/nats/), and the one options type both ingests take.
 */
import type { Registry } from "prom-client";
import type { DiscoveryWatcher } from "../../discovery/types.ts";
import type { Logger } from "../../util/log.ts";
import type { KvIndex } from "../index.ts";
import type { IndexSync } from "../prefix-index.ts";

/** One worker rank's feed of KV event batches into the shared index. */
export interface KvFeed {
  readonly workerId: string;
  readonly dpRank: number;
  /** The rank's sync state (./rank-sync.ts rules). */
  readonly sync: IndexSync;
  /** Ms from the feed's start to its first `synced` (-1: not yet). */
  readonly syncMs: number;
  /** Resolves once the start-up replay is done (or failed) and live batches are applied. */
  readonly synced: Promise<void>;
  close(): void | Promise<void>;
}

/** How SUB sockets are read: libzmq's C API (./zmq-native.ts) or zeromq.js. */
export type KvZmqReader = "native" | "zeromq";

/** The options of every KV ingest (ZMQ: KvIngest; NATS: NatsKvIngest adds its connection). */
export interface KvFeedOptions {
  watcher: DiscoveryWatcher;
  index?: KvIndex;
  logger?: Logger;
  /** The server's prom-client Registry; a private one when absent. */
  registry?: Registry;
  /** Only workers of this model (any model when absent). */
  model?: string;
  /** A replay's stall timeout (default 2000 ms): no reply for this long ends a round / page. */
  replayTimeoutMs?: number;
  /** Index cap per rank when a record has no `kvBlocks` (only when `index` is not given). */
  maxBlocksPerWorker?: number;
  /** ZMQ plane only: how SUB sockets are read (default native where it loads). */
  zmqReader?: KvZmqReader;
}

/**
 * Where a sequenced batch stream (the NATS plane's subscriber) delivers: batches strictly in
 * sequence order, and what it learnt about the rank's history. ./nats.ts turns these into the
 * index and sync rules.
 */
export interface KvBatchSink {
  /** One engine EventBatch (msgpack bytes, unchanged) with its engine sequence number. */
  onBatch(seq: number, payload: Uint8Array): void;
  /** History was lost (or the engine restarted): drop what is known about this worker rank. */
  onReset(reason: string): void;
  /**
   * The start-up replay could not give the whole history (no answer, or a buffer that no longer
   * reaches back to seq 0): what the index holds is partial, not "empty".
   */
  onUnknown?(reason: string): void;
  /** A batch was refused, not applied: `epoch` (not the record's) or `restart` (unannounced). */
  onRefused?(reason: KvRefusal): void;
}

export type KvRefusal = "epoch" | "restart";

/** A sequenced batch stream feeding one KvBatchSink (the NATS plane's subscriber). */
export interface KvBatchStream {
  /** Its counters (delivered, refused, resets, …), shown as the feed's `stats`. */
  readonly stats: object;
  /** Resolves after the start-up replay (if any) was delivered. */
  start(): Promise<void>;
  close(): void;
}
