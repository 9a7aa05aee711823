import type { WorkerRecord } from "../../src/discovery/types.ts";

/**
 * A mixed sim worker's discovery record with the fields most tests do not care about filled in
 * (no connector, block size 16, dp/tp 1, 4096-token context, started now); `o` overrides any.
 */
export function mixedRecord(
  o: Partial<WorkerRecord> & Pick<WorkerRecord, "id" | "model" | "url">,
): WorkerRecord {
  const { id, model, url, ...rest } = o;
  return {
    id,
    model,
    servedModelNames: [model],
    engine: "sim",
    role: "mixed",
    url,
    connector: { kind: "none" },
    blockSize: 16,
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
    ...rest,
  };
}
