/**
 * The server's KV ingestion extension (`ServerExtensions.kvIngestFactory`): when the policy is
 * kv-aware, one KvIngest follows the server's discovery watcher and feeds one KvIndex, which the
 * AutoRouter hands to every model's policy as `PolicyContext.kvIndex` (worker ids are unique
 * across models, so one index serves them all). Other policies get no ingestion.
 */
import type { KvIngestFactory, KvIngest as ServerKvIngest } from "../server/extensions.ts";
import { KvIngest } from "./ingest.ts";

export interface ServerKvIngestHandle extends ServerKvIngest {
  /** The ingest itself (null when the policy does not use KV events). */
  readonly ingest: KvIngest | null;
}

/** Policies that read the KV index. */
const KV_POLICIES = new Set(["kv-aware"]);

export const createServerKvIngest: KvIngestFactory = (ctx): ServerKvIngestHandle => {
  if (!KV_POLICIES.has(ctx.config.policy))
    return { ingest: null, indexFor: () => undefined, close: async () => {} };
  const replay = Number(ctx.config.policyOptions.kvReplayTimeoutMs);
  const ingest = new KvIngest({
    watcher: ctx.discovery,
    logger: ctx.logger.child({ component: "kv-ingest" }),
    registry: ctx.registry,
    replayTimeoutMs: Number.isFinite(replay) && replay > 0 ? replay : undefined,
  });
  ingest.start();
  return { ingest, indexFor: () => ingest.index, close: () => ingest.close() };
};
