import type { ConnectorKind } from "../../../discovery/types.ts";
import { atomProtocol } from "./atom.ts";
import { mooncakeProtocol } from "./mooncake.ts";
import { moriioProtocol } from "./moriio.ts";
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
