/**
 * ATOM serial relay (docs/engine-protocols.md#pd-atom): P's `kv_transfer_params` to D, plus
 * `remote_dp_size` / `remote_tp_size` from P's `GET /kv_transfer_info` and `remote_dp_rank`.
 */
import type { WorkerRecord } from "../../../discovery/types.ts";
import { prefillOnlyBody, type SerialProtocol, withKvParams } from "./types.ts";

function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

export const atomProtocol: SerialProtocol = {
  kind: "atom",
  mode: "serial",
  peerInfo: (p: WorkerRecord) => ({ url: `${p.url.replace(/\/+$/, "")}/kv_transfer_info` }),
  prefillBody: ({ body }) => prefillOnlyBody(body, { do_remote_decode: true, do_remote_prefill: false }),
  decodeBody: ({ body, prefill, peer }, p) =>
    withKvParams(body, {
      ...p,
      remote_dp_size: num(peer?.dp_size) ?? prefill.dpSize,
      remote_tp_size: num(peer?.tp_size) ?? num(p.tp_size) ?? prefill.tpSize,
      remote_dp_rank: num(p.dp_rank) ?? num(peer?.dp_rank) ?? prefill.dpRank ?? 0,
    }),
};
