/**
 * The server's KV ingestion extension (`ServerExtensions.kvIngestFactory`): one KvIngest follows
 * the server's discovery watcher and feeds one KvIndex, which the AutoRouter hands to every
 * model's scheduler (worker ids are unique across models, so one index serves them all). The
 * server calls it only when its scheduling profiles need the index (a plugin declaring
 * `kvIndex`, src/router/pipeline); otherwise nothing is ingested.
 */

import { Counter, Histogram } from "prom-client";
import type { KvIngestFactory, KvIngest as ServerKvIngest } from "../server/extension-api.ts";
import { KvIngest } from "./feeds/zmq-ingest.ts";

export interface ServerKvIngestHandle extends ServerKvIngest {
  /** The ingest itself. */
  readonly ingest: KvIngest | null;
}

export const createServerKvIngest: KvIngestFactory = (ctx): ServerKvIngestHandle => {
  const ingest = new KvIngest({
    watcher: ctx.discovery,
    logger: ctx.logger.child({ component: "kv-ingest" }),
    registry: ctx.registry,
    // The config's `ingest` section (validated; the old policy options are aliases of it).
    replayTimeoutMs: ctx.config.ingest.kvReplayTimeoutMs,
    // Index cap per DP rank for workers whose record has no kvBlocks.
    maxBlocksPerWorker: ctx.config.ingest.kvMaxBlocksPerWorker,
  });
  const decisions = new Counter({
    name: "infera_kv_routing_decisions_total",
    help: "KV-aware routing decisions by reason (overlap, load, load-balance)",
    labelNames: ["reason"],
    registers: [ctx.registry],
  });
  const overlap = new Histogram({
    name: "infera_kv_routing_overlap_ratio",
    help: "Cached fraction of the prompt (index view) on the worker kv-aware chose",
    buckets: [0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1],
    registers: [ctx.registry],
  });
  const overlapBlocks = new Counter({
    name: "infera_kv_routing_overlap_blocks_total",
    help: "Cached prompt blocks (index view) on the workers kv-aware chose",
    registers: [ctx.registry],
  });
  ingest.index.decisionObserver = (reason, cached, blocks) => {
    decisions.inc({ reason });
    overlapBlocks.inc(cached);
    overlap.observe(blocks > 0 ? cached / blocks : 0);
  };
  ingest.start();
  return {
    ingest,
    indexFor: () => ingest.index,
    syncReport: () => ingest.syncReport(),
    close: () => ingest.close(),
  };
};
