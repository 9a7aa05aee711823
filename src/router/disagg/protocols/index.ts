import type { ConnectorKind, WorkerRecord } from "../../../discovery/types.ts";
import { atomProtocol } from "./atom.ts";
import { mooncakeProtocol } from "./mooncake.ts";
import { moriioProtocol, moriioTransferMode, moriioWriteProtocol } from "./moriio.ts";
import { nixlProtocol } from "./nixl.ts";
import { sglangProtocol } from "./sglang.ts";
import type { PdProtocol } from "./types.ts";

export type { ConcurrentProtocol, PdInput, PdProtocol, SerialProtocol } from "./types.ts";

/** The protocol a worker's connector speaks; a P and a D are paired only when they match. */
export const pdProtocols: Readonly<Record<Exclude<ConnectorKind, "none">, PdProtocol>> = {
  nixl: nixlProtocol,
  mooncake: mooncakeProtocol,
  moriio: moriioProtocol,
  sglang: sglangProtocol,
  atom: atomProtocol,
};

export function protocolFor(kind: ConnectorKind): PdProtocol | null {
  return kind === "none" ? null : (pdProtocols[kind] ?? null);
}

/** The protocol for one request on P (MoRIIO's depends on the workers' transfer mode). */
export function protocolForPair(kind: Exclude<ConnectorKind, "none">, prefill: WorkerRecord): PdProtocol {
  if (kind === "moriio" && moriioTransferMode(prefill) === "WRITE") return moriioWriteProtocol;
  return pdProtocols[kind];
}

/**
 * What a P and a D must share to be paired: the connector, and for MoRIIO the transfer mode
 * (vLLM's MoRIIO proxy refuses workers of mixed modes).
 */
export function pairingKey(rec: WorkerRecord): string {
  const kind = rec.connector.kind;
  return kind === "moriio" ? `moriio:${moriioTransferMode(rec)}` : kind;
}
