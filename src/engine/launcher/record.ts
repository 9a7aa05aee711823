/** The worker record a launcher registers for its engine (DESIGN.md "Planes"). */
import { hostname } from "node:os";
import type { WorkerRecord } from "../../discovery/types.ts";
import type { EngineAdapter, LaunchSpec } from "./types.ts";

export interface RecordFacts {
  startedAt: Date;
  /** What the engine reported (e.g. vLLM's `/v1/models` max_model_len), when the flag was not given. */
  maxModelLen?: number;
  /** KV blocks of one DP rank's pool, when the engine (or `--num-gpu-blocks-override`) said. */
  kvBlocks?: number;
  /** The extra routes the engine answered (./routes-probe.ts). */
  routes?: string[];
}

export function buildWorkerRecord(
  spec: LaunchSpec,
  adapter: EngineAdapter,
  facts: RecordFacts,
): WorkerRecord {
  const labels: Record<string, string> = { host: hostname() };
  if (spec.backend !== "none") labels.transferBackend = spec.backend;
  const rec: WorkerRecord = {
    id: spec.workerId,
    model: spec.model,
    servedModelNames: spec.servedModelNames.length > 0 ? [...spec.servedModelNames] : [spec.model],
    engine: spec.engine,
    role: spec.role,
    url: `http://${urlHost(spec.advertiseHost)}:${spec.port}`,
    connector: adapter.connector(spec),
    blockSize: spec.blockSize ?? adapter.defaultBlockSize,
    dpSize: spec.dp ?? 1,
    tpSize: spec.tp ?? 1,
    // 0 = unknown (neither the flag nor the engine said).
    maxModelLen: spec.maxModelLen ?? facts.maxModelLen ?? 0,
    startedAt: facts.startedAt.toISOString(),
    labels,
  };
  if (facts.kvBlocks !== undefined) rec.kvBlocks = facts.kvBlocks;
  if (facts.routes && facts.routes.length > 0) rec.routes = [...facts.routes];
  const kv = adapter.kvEvents(spec);
  if (kv) rec.kvEvents = kv;
  return rec;
}

function urlHost(host: string): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
}
