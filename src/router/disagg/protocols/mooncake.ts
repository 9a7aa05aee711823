/**
 * vLLM MooncakeConnector (docs/engine-protocols.md#pd-mooncake): concurrent. P gets the prefill-only body
 * with `transfer_id`; D gets the client's body with P's bootstrap address, the engine id P's
 * bootstrap `GET /query` reports, P's dp rank and the same `transfer_id`.
 */
import { randomUUID } from "node:crypto";
import type { WorkerRecord } from "../../../discovery/types.ts";
import {
  type ConcurrentProtocol,
  connectorHost,
  prefillOnlyBody,
  servedDpRanks,
  withKvParams,
} from "./types.ts";

export const MOONCAKE_DEFAULT_BOOTSTRAP_PORT = 8998;

export function mooncakeBootstrapAddr(p: WorkerRecord): string {
  const host = connectorHost(p);
  const h = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
  return `http://${h}:${p.connector.bootstrapPort ?? MOONCAKE_DEFAULT_BOOTSTRAP_PORT}`;
}

/**
 * The engine id of each DP rank in a bootstrap `GET /query` answer, whose shape varies by
 * version. Current vLLM answers `dict[dp_rank, {engine_id, worker_addr}]`
 * (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_utils.py
 * @ e7ad92e); older ones `dict[engine_id, {dp_rank: ...}]` (the Mooncake proxy example @
 * f1b4b28 reads that one); a flat `{engine_id}` or a `dp_ranks` map also occur.
 */
export function engineIdsFromQuery(q: Readonly<Record<string, unknown>> | undefined): Map<number, string> {
  const out = new Map<number, string>();
  if (!q) return out;
  const isRank = (k: string) => /^\d+$/.test(k);
  const byRank = (container: unknown) => {
    if (!container || typeof container !== "object") return;
    for (const [k, v] of Object.entries(container as Record<string, unknown>)) {
      const id = v && typeof v === "object" ? (v as Record<string, unknown>).engine_id : undefined;
      if (isRank(k) && typeof id === "string") out.set(Number(k), id);
    }
  };
  byRank(q.dp_ranks);
  byRank(q);
  if (out.size > 0) return out;
  for (const [k, v] of Object.entries(q)) {
    // Older: engine id → {dp rank → workers}.
    if (isRank(k) || !v || typeof v !== "object" || Array.isArray(v)) continue;
    for (const r of Object.keys(v as Record<string, unknown>)) if (isRank(r)) out.set(Number(r), k);
  }
  return out;
}

/** The engine id for `dpRank` in a `/query` answer (see engineIdsFromQuery); null if none. */
export function engineIdFromQuery(
  q: Readonly<Record<string, unknown>> | undefined,
  dpRank: number,
): string | null {
  if (!q) return null;
  for (const k of ["engine_id", "remote_engine_id"]) if (typeof q[k] === "string") return q[k] as string;
  const ids = engineIdsFromQuery(q);
  return ids.get(dpRank) ?? ids.values().next().value ?? null;
}

/**
 * Several DP ranks behind P's URL: the request is pinned to one with `X-data-parallel-rank`
 * and D gets that rank's engine id and `remote_dp_rank`, as vLLM's Mooncake proxy does
 * (examples/online_serving/disaggregated_serving/mooncake_connector/mooncake_connector_proxy.py
 * @ f1b4b28); unpinned, vLLM's own DP balancer picks any rank and D pulls from the wrong engine.
 */
export const mooncakeProtocol: ConcurrentProtocol = {
  kind: "mooncake",
  mode: "concurrent",
  peerInfo: (p) => ({ url: `${mooncakeBootstrapAddr(p)}/query` }),
  newTransferId: () => `xfer-${randomUUID()}`,
  dpRanks(p, peer) {
    if (p.dpRank !== undefined) return [p.dpRank];
    // The record says its URL serves one rank: nothing to pin (the bootstrap server on the
    // global rank 0 lists every rank of the deployment, not only this URL's).
    if (p.dpSize <= 1) return [];
    const ranks = [...engineIdsFromQuery(peer).keys()].sort((a, b) => a - b);
    return ranks.length > 0 ? ranks : servedDpRanks(p);
  },
  bodies({ body, prefill, peer, transferId: tid, prefillDpRank }) {
    const transferId = tid ?? `xfer-${randomUUID()}`;
    const dpRank = prefillDpRank ?? prefill.dpRank ?? 0;
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
