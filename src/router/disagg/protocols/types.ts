/**
 * One PD protocol per connector (docs/engine-protocols.md#pd), behind one interface. A protocol is
 * pure body/param shaping: the DisaggRouter does the I/O (sending, racing, retrying). Serial
 * protocols (Nixl, MoRIIO read, ATOM) build D's body from P's answer; concurrent ones
 * (Mooncake, SGLang bootstrap) build both bodies up front and the router fires them together.
 */
import type { ConnectorKind, WorkerRecord } from "../../../discovery/types.ts";
import { appendFields, rawBodyOf, setRawBody } from "../../../transport/types.ts";

export interface PdInput {
  /** The client's validated body (never mutated). */
  body: Readonly<Record<string, unknown>>;
  /** The id both halves carry as `X-Request-Id`. */
  requestId: string;
  prefill: WorkerRecord;
  decode: WorkerRecord;
  /** What `peerInfo` returned for this P (Mooncake `/query`, ATOM `/kv_transfer_info`). */
  peer?: Readonly<Record<string, unknown>>;
  /** The id both halves' `kv_transfer_params.transfer_id` carry, where the protocol has one. */
  transferId?: string;
  /**
   * The data-parallel rank of P this request is pinned to (sent to P as
   * `X-data-parallel-rank` when P's URL serves several ranks), where the protocol pins one.
   */
  prefillDpRank?: number;
}

/** A GET the router makes to P before routing to it (answers are cached per worker). */
export interface PeerInfoRequest {
  url: string;
}

interface ProtocolBase {
  readonly kind: Exclude<ConnectorKind, "none">;
  /** P's control endpoint the router must read first, if any. */
  peerInfo?(prefill: WorkerRecord): PeerInfoRequest;
  /** The request id both halves get (MoRIIO's newer form embeds both peers' addresses). */
  requestId?(base: string, prefill: WorkerRecord, decode: WorkerRecord): string;
  /** A fresh `transfer_id` for one request (both halves get the same). */
  newTransferId?(): string;
  /**
   * The DP ranks of P a request may be pinned to, when the D side must name the rank P runs
   * it on (Mooncake's per-rank engine id, MoRIIO's `remote_dp_rank`). The router pins one.
   */
  dpRanks?(prefill: WorkerRecord, peer: Readonly<Record<string, unknown>> | undefined): number[];
}

export interface SerialProtocol extends ProtocolBase {
  readonly mode: "serial";
  prefillBody(input: PdInput): Record<string, unknown>;
  /** D's body from P's answer's top-level `kv_transfer_params`. */
  decodeBody(input: PdInput, prefillParams: Readonly<Record<string, unknown>>): Record<string, unknown>;
  /**
   * Best effort: tells P to free what it holds for D when D will never pull it, where the
   * protocol has a way to (MoRIIO's notify). Others rely on P's own hold timeout.
   */
  releasePrefill?(input: PdInput, prefillParams: Readonly<Record<string, unknown>>): Promise<void>;
}

export interface ConcurrentProtocol extends ProtocolBase {
  readonly mode: "concurrent";
  bodies(input: PdInput): { prefill: Record<string, unknown>; decode: Record<string, unknown> };
}

export type PdProtocol = SerialProtocol | ConcurrentProtocol;

function clientKvParams(body: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const p = body.kv_transfer_params;
  return p && typeof p === "object" && !Array.isArray(p) ? { ...(p as Record<string, unknown>) } : {};
}

/**
 * The prefill half of a serial protocol: `stream: false`, `max_tokens: 1` (and
 * `max_completion_tokens: 1` when the client set it), `stream_options` and `min_tokens`
 * removed, and the protocol's `kv_transfer_params` (over any the client sent, e.g. kvd's
 * `infera_retention`).
 *
 * Sent as the client's bytes with these fields appended (see withAppended): a removed field is
 * appended as its engine default instead, `stream_options: null` (vLLM: `StreamOptions | None =
 * None`, checked by truthiness in `validate_stream_options`) and `min_tokens: 0` (vLLM:
 * `min_tokens: int = 0`) — vllm-project/vllm vllm/entrypoints/openai/chat_completion/protocol.py
 * @ d5dba2d7b0ab9b98096560c69db7126b54b14d79; ATOM's request models ignore both
 * (`extra: "ignore"`, ROCm/ATOM atom/entrypoints/openai/protocol.py @
 * 238c1c718bb13568530967d4b8c12f016c9181ec).
 */
export function prefillOnlyBody(
  body: Readonly<Record<string, unknown>>,
  kvParams: Record<string, unknown>,
): Record<string, unknown> {
  const out: Record<string, unknown> = { ...body, stream: false, max_tokens: 1 };
  if ("max_completion_tokens" in body) out.max_completion_tokens = 1;
  delete out.stream_options;
  delete out.min_tokens;
  out.kv_transfer_params = { ...clientKvParams(body), ...kvParams };
  return withAppended(body, out, {
    stream: false,
    max_tokens: 1,
    max_completion_tokens: "max_completion_tokens" in body ? 1 : undefined,
    stream_options: "stream_options" in body ? null : undefined,
    min_tokens: "min_tokens" in body ? 0 : undefined,
    kv_transfer_params: out.kv_transfer_params,
  });
}

/** The decode half: the client's body unchanged but for `kv_transfer_params`. */
export function withKvParams(
  body: Readonly<Record<string, unknown>>,
  kvParams: Record<string, unknown>,
): Record<string, unknown> {
  const merged = { ...clientKvParams(body), ...kvParams };
  return withAppended(body, { ...body, kv_transfer_params: merged }, { kv_transfer_params: merged });
}

/**
 * Registers `out`'s bytes as the client's bytes of `body` with `fields` appended, when the
 * server has those bytes (src/transport/types.ts: the engines keep the last of duplicate
 * keys, so an appended field overrides the client's). A PD half then costs no serialisation of
 * the prompt; without them, `out` is serialised when sent. Returns `out`.
 */
export function withAppended(
  body: Readonly<Record<string, unknown>>,
  out: Record<string, unknown>,
  fields: Readonly<Record<string, unknown>>,
): Record<string, unknown> {
  const raw = rawBodyOf(body);
  const spliced = raw ? appendFields(raw, fields) : null;
  if (spliced) setRawBody(out, spliced);
  return out;
}

/**
 * The ranks a record's URL serves: its own `dpRank` when it names one (one API server per
 * rank), else 0..dpSize-1 (one API server load-balancing over its ranks).
 */
export function servedDpRanks(rec: WorkerRecord): number[] {
  if (rec.dpRank !== undefined) return [rec.dpRank];
  return Array.from({ length: Math.max(1, rec.dpSize) }, (_, i) => i);
}

/** The host other workers reach a worker's side channel on: the record's, else its URL's. */
export function connectorHost(rec: WorkerRecord): string {
  return rec.connector.bootstrapHost ?? new URL(rec.url).hostname;
}
