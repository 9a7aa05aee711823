/**
 * vLLM MoRIIOConnector (docs/engine-protocols.md#pd-moriio), as vLLM's own router prepares it
 * (vllm-project/router src/routers/http/moriio_pd_router.rs @ a9e5c52):
 *
 * - Both halves carry the same `transfer_id` (`tx-<uuid>`): current vLLM reads
 *   `kv_transfer_params["transfer_id"]` unconditionally on P and on D.
 * - P gets D's address (`remote_host`, `remote_port` = D's HTTP port, handshake and notify
 *   ports, `remote_dp_size` / `remote_tp_size`), D gets P's, plus `remote_dp_rank` when P runs
 *   several DP ranks (the rank P is pinned to with `X-data-parallel-rank`).
 * - READ mode (`transfer_mode: "READ"`, `read_mode: true`): serial; D also gets P's answer's
 *   `remote_engine_id` and `remote_block_ids` and pulls. WRITE mode (vLLM's default):
 *   concurrent; D's ids stay null, P pushes once D has told it its blocks.
 *
 * The mode is the worker's registered `transfer_mode` (record `connector.transferMode`);
 * absent means READ, the mode Infera's launchers configure. Both halves also carry the
 * request-id form `___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}` when both records
 * name their handshake and notify ports, for versions that read the peers from the id.
 */
import { randomBytes, randomUUID } from "node:crypto";
import type { WorkerRecord } from "../../../discovery/types.ts";
import { sendMoriioNotify } from "../moriio-notify.ts";
import {
  type ConcurrentProtocol,
  connectorHost,
  type PdInput,
  prefillOnlyBody,
  type SerialProtocol,
  servedDpRanks,
  withKvParams,
} from "./types.ts";

/** A worker's MoRIIO address as it registers it: `host:IP,handshake:P,notify:P`. */
export function moriioZmqAddress(rec: WorkerRecord): string | null {
  const { handshakePort, notifyPort } = rec.connector;
  if (!handshakePort || !notifyPort) return null;
  return `host:${connectorHost(rec)},handshake:${handshakePort},notify:${notifyPort}`;
}

export function moriioTransferMode(rec: WorkerRecord): "READ" | "WRITE" {
  return rec.connector.transferMode === "WRITE" ? "WRITE" : "READ";
}

const pick = (p: Readonly<Record<string, unknown>>, key: string, fallback: unknown) =>
  p[key] !== undefined && p[key] !== null ? p[key] : fallback;

function httpPort(rec: WorkerRecord): number {
  const u = new URL(rec.url);
  return u.port ? Number(u.port) : u.protocol === "https:" ? 443 : 80;
}

function transferId(input: PdInput): string {
  return input.transferId ?? `tx-${randomUUID()}`;
}

/** P's half: its own prefill plus where D is (both modes). */
function prefillBody(input: PdInput): Record<string, unknown> {
  const d = input.decode;
  return prefillOnlyBody(input.body, {
    transfer_id: transferId(input),
    do_remote_decode: true,
    do_remote_prefill: false,
    remote_engine_id: null,
    remote_block_ids: null,
    remote_host: connectorHost(d),
    remote_port: httpPort(d),
    remote_handshake_port: d.connector.handshakePort ?? null,
    remote_notify_port: d.connector.notifyPort ?? null,
    remote_dp_size: d.dpSize,
    remote_tp_size: d.tpSize,
  });
}

/** D's half: where P is; in READ mode also what P's answer says it holds. */
function decodeBody(input: PdInput, answer: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const p = input.prefill;
  const params: Record<string, unknown> = {
    transfer_id: transferId(input),
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_engine_id: answer.remote_engine_id ?? null,
    remote_block_ids: answer.remote_block_ids ?? null,
    remote_host: pick(answer, "remote_host", connectorHost(p)),
    remote_port: httpPort(p),
    remote_handshake_port: pick(answer, "remote_handshake_port", p.connector.handshakePort ?? null),
    remote_notify_port: pick(answer, "remote_notify_port", p.connector.notifyPort ?? null),
    remote_dp_size: pick(answer, "remote_dp_size", p.dpSize),
    remote_tp_size: pick(answer, "remote_tp_size", pick(answer, "tp_size", p.tpSize)),
    remote_dp_rank: input.prefillDpRank ?? pick(answer, "remote_dp_rank", p.dpRank ?? 0),
  };
  if (answer.remote_request_id !== undefined) params.remote_request_id = answer.remote_request_id;
  return withKvParams(input.body, params);
}

function requestId(base: string, prefill: WorkerRecord, decode: WorkerRecord): string {
  const pa = moriioZmqAddress(prefill);
  const da = moriioZmqAddress(decode);
  if (!pa || !da) return base;
  // The id's tail must be 32 hex digits; derive it from the base id when it is a uuid.
  const hex = base.replace(/[^0-9a-f]/gi, "").toLowerCase();
  const tail = hex.length >= 32 ? hex.slice(-32) : randomBytes(16).toString("hex");
  return `___prefill_addr_${pa}___decode_addr_${da}_${tail}`;
}

const common = {
  kind: "moriio" as const,
  requestId,
  newTransferId: () => `tx-${randomUUID()}`,
  dpRanks: (p: WorkerRecord) => servedDpRanks(p),
};

/** READ (pull) mode: serial like Nixl. */
export const moriioProtocol: SerialProtocol = {
  ...common,
  mode: "serial",
  prefillBody,
  async releasePrefill(input, p) {
    const { prefill } = input;
    const host = typeof p.remote_host === "string" ? p.remote_host : connectorHost(prefill);
    // P's notify listener for DP rank r is notify_port + r (get_port_offset); D reads there too.
    const rank = input.prefillDpRank ?? (typeof p.remote_dp_rank === "number" ? p.remote_dp_rank : 0);
    const base =
      typeof p.remote_notify_port === "number" ? p.remote_notify_port : prefill.connector.notifyPort;
    // P releases by transfer id (moriio_engine.py _handle_release_message).
    const id = typeof p.transfer_id === "string" ? p.transfer_id : transferId(input);
    if (base) await sendMoriioNotify(host, base + rank, id);
  },
  decodeBody,
};

/** WRITE (push) mode: both halves at once; D's engine and block ids stay null. */
export const moriioWriteProtocol: ConcurrentProtocol = {
  ...common,
  mode: "concurrent",
  bodies: (input) => ({ prefill: prefillBody(input), decode: decodeBody(input, {}) }),
};
