/**
 * vLLM MoRIIOConnector, READ (pull) mode (engine-protocols.md §4c): serial like Nixl; D gets
 * P's engine id and block ids with P's handshake/notify ports and dp/tp layout. Both halves
 * carry the newer request-id form `___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}` when
 * both records name their handshake and notify ports, so versions that read peers from the
 * id work too.
 */
import { randomBytes } from "node:crypto";
import type { WorkerRecord } from "../../../discovery/types.ts";
import { sendMoriioNotify } from "../moriio-notify.ts";
import { connectorHost, prefillOnlyBody, type SerialProtocol, withKvParams } from "./types.ts";

/** A worker's MoRIIO address as it registers it: `host:IP,handshake:P,notify:P`. */
export function moriioZmqAddress(rec: WorkerRecord): string | null {
  const { handshakePort, notifyPort } = rec.connector;
  if (!handshakePort || !notifyPort) return null;
  return `host:${connectorHost(rec)},handshake:${handshakePort},notify:${notifyPort}`;
}

const pick = (p: Readonly<Record<string, unknown>>, key: string, fallback: unknown) =>
  p[key] !== undefined && p[key] !== null ? p[key] : fallback;

export const moriioProtocol: SerialProtocol = {
  kind: "moriio",
  mode: "serial",
  requestId(base, prefill, decode) {
    const pa = moriioZmqAddress(prefill);
    const da = moriioZmqAddress(decode);
    if (!pa || !da) return base;
    // The id's tail must be 32 hex digits; derive it from the base id when it is a uuid.
    const hex = base.replace(/[^0-9a-f]/gi, "").toLowerCase();
    const tail = hex.length >= 32 ? hex.slice(-32) : randomBytes(16).toString("hex");
    return `___prefill_addr_${pa}___decode_addr_${da}_${tail}`;
  },
  prefillBody: ({ body }) =>
    prefillOnlyBody(body, {
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    }),
  async releasePrefill({ prefill, requestId }, p) {
    const host = typeof p.remote_host === "string" ? p.remote_host : connectorHost(prefill);
    const port =
      typeof p.remote_notify_port === "number" ? p.remote_notify_port : prefill.connector.notifyPort;
    const id = typeof p.remote_request_id === "string" ? p.remote_request_id : requestId;
    if (port) await sendMoriioNotify(host, port, id);
  },
  decodeBody: ({ body, prefill }, p) =>
    withKvParams(body, {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: p.remote_engine_id,
      remote_block_ids: p.remote_block_ids,
      remote_request_id: p.remote_request_id,
      remote_host: pick(p, "remote_host", connectorHost(prefill)),
      remote_handshake_port: pick(p, "remote_handshake_port", prefill.connector.handshakePort),
      remote_notify_port: pick(p, "remote_notify_port", prefill.connector.notifyPort),
      remote_dp_size: pick(p, "remote_dp_size", prefill.dpSize),
      remote_tp_size: pick(p, "remote_tp_size", pick(p, "tp_size", prefill.tpSize)),
      remote_dp_rank: pick(p, "remote_dp_rank", prefill.dpRank ?? 0),
    }),
};
