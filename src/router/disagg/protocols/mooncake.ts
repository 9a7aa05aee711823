/**
 * vLLM MooncakeConnector (engine-protocols.md §4b): concurrent. P gets the prefill-only body
 * with `transfer_id`; D gets the client's body with P's bootstrap address, the engine id P's
 * bootstrap `GET /query` reports, P's dp rank and the same `transfer_id`.
 */
import { randomUUID } from "node:crypto";
import type { WorkerRecord } from "../../../discovery/types.ts";
import { type ConcurrentProtocol, connectorHost, prefillOnlyBody, withKvParams } from "./types.ts";

export const MOONCAKE_DEFAULT_BOOTSTRAP_PORT = 8998;

export function mooncakeBootstrapAddr(p: WorkerRecord): string {
  const host = connectorHost(p);
  const h = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
  return `http://${h}:${p.connector.bootstrapPort ?? MOONCAKE_DEFAULT_BOOTSTRAP_PORT}`;
}

/**
 * The engine id in a `/query` answer, whose shape varies by version: a top-level
 * `engine_id`, or a map of dp rank → `{engine_id, ...}`.
 */
export function engineIdFromQuery(
  q: Readonly<Record<string, unknown>> | undefined,
  dpRank: number,
): string | null {
  if (!q) return null;
  for (const k of ["engine_id", "remote_engine_id"]) if (typeof q[k] === "string") return q[k] as string;
  for (const container of [q.dp_ranks, q]) {
    if (!container || typeof container !== "object") continue;
    const byRank = container as Record<string, unknown>;
    const entry = (byRank[String(dpRank)] ?? Object.values(byRank)[0]) as Record<string, unknown> | undefined;
    if (entry && typeof entry === "object" && typeof entry.engine_id === "string") return entry.engine_id;
  }
  return null;
}

export const mooncakeProtocol: ConcurrentProtocol = {
  kind: "mooncake",
  mode: "concurrent",
  peerInfo: (p) => ({ url: `${mooncakeBootstrapAddr(p)}/query` }),
  bodies({ body, prefill, peer }) {
    const transferId = `xfer-${randomUUID()}`;
    const dpRank = prefill.dpRank ?? 0;
    return {
      prefill: prefillOnlyBody(body, {
        do_remote_decode: true,
        do_remote_prefill: false,
        transfer_id: transferId,
      }),
      decode: withKvParams(body, {
        do_remote_decode: false,
        do_remote_prefill: true,
        remote_bootstrap_addr: mooncakeBootstrapAddr(prefill),
        remote_engine_id: engineIdFromQuery(peer, dpRank) ?? prefill.id,
        remote_dp_rank: dpRank,
        transfer_id: transferId,
      }),
    };
  },
};
