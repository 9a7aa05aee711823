/**
 * The server's extension API: the seams where other components plug into the server without
 * editing it. Types only, so a component implementing a seam (src/kv/server-ingest.ts,
 * src/transport/nats/server-plug.ts) imports its contract without importing the server or the
 * other components. What ships plugged in is wired in ./builtin-extensions.ts; `startServer`
 * also takes overrides.
 */
import type { Registry } from "prom-client";
import type { DiscoveryWatcher } from "../discovery/types.ts";
import type { KvSyncReport, PrefixIndex } from "../kv/prefix-index.ts";
import type { PeerPlane } from "../router/peers/types.ts";
import type { DisaggRouterFactory, RequestExecutor } from "../router/types.ts";
import type { WorkerSet } from "../router/worker-set.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import type { Logger } from "../util/log.ts";
import type { ServerConfig } from "./config.ts";

/** KV event ingestion for plugins that need `kvIndex`: follows the WorkerSet, subscribes to each worker's events. */
export interface KvIngest {
  /** The model's KV prefix index, handed to the model's Scheduler (`Scheduling.create`). */
  indexFor(model: string): PrefixIndex | undefined;
  /** Each rank's index sync; absent for an ingest that cannot tell. */
  syncReport?(): KvSyncReport;
  close(): Promise<void>;
}

export interface ServerComponentContext {
  config: ServerConfig;
  /** The started discovery watcher the WorkerSet follows. */
  discovery: DiscoveryWatcher;
  workers: WorkerSet;
  /** The server's own prom-client registry (served on GET /metrics). */
  registry: Registry;
  tokenizer: Tokenizer;
  logger: Logger;
}

export type KvIngestFactory = (ctx: ServerComponentContext) => KvIngest | Promise<KvIngest>;

/** A request plane. `forget` drops per-worker state when a worker leaves. */
export interface ManagedExecutor extends RequestExecutor {
  forget?(url: string): void;
  close?(): Promise<void>;
}

export type ExecutorFactory = (ctx: ServerComponentContext) => ManagedExecutor | Promise<ManagedExecutor>;

/** Routing state shared with peer replicas (src/router/peers); null when not configured. */
export type PeerPlaneFactory = (ctx: ServerComponentContext) => Promise<PeerPlane | null>;

export interface ServerExtensions {
  /** Plugged into the AutoRouter: models with prefill and decode workers go disaggregated. */
  disaggRouterFactory?: DisaggRouterFactory;
  /** Created when a plugin of a configured profile needs `kvIndex` (the engines' KV events). */
  kvIngestFactory?: KvIngestFactory;
  /** Started when a profile reads prompts (`approxTree`): replicas share routed prefixes. */
  peerPlaneFactory?: PeerPlaneFactory;
  /** Extra request planes by `requestPlane` name (`http` is built in). */
  executors?: Record<string, ExecutorFactory>;
}
