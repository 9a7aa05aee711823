/**
 * The seam between the simulated engine's core (scheduler, block pool, HTTP API) and its
 * PD connectors (one module per protocol in this folder). The core implements `SimKvHost`;
 * each connector implements `SimConnector`. Neither side knows the other's internals.
 *
 * Flow, prefill role: the API sees `kv_transfer_params.do_remote_decode: true`, runs the
 * prompt (one output token), then calls `host.holdBlocks(requestId)` so the blocks stay
 * allocated after the request finishes, and `connector.onPrefillFinished(...)` whose result
 * becomes the response's top-level `kv_transfer_params`. The connector serves pulls over its
 * side channel and calls `host.releaseHeld(requestId)` when D has pulled or the hold expired.
 *
 * Flow, decode role: the API sees `kv_transfer_params.do_remote_prefill: true`, calls
 * `connector.pullForDecode(...)` (which fetches the KV payload from P over a real socket),
 * then `host.importBlocks(...)` with the pulled prompt tokens so those blocks count as
 * computed (source "external_kv_transfer"), then schedules the request normally.
 */
import type { ConnectorKind } from "../../../discovery/types.ts";

export interface PdRequestInfo {
  /** The engine request id (X-Request-Id or generated). */
  requestId: string;
  /** The request's `kv_transfer_params` as received. */
  params: Record<string, unknown>;
  /** The whole request body (SGLang bootstrap fields live at the top level). */
  body: Record<string, unknown>;
  promptTokenIds: readonly number[];
}

export interface HeldKv {
  requestId: string;
  /** Engine block ids (indices into the sim's block pool). */
  blockIds: number[];
  /** The prompt tokens whose KV the held blocks contain (full blocks + partial tail). */
  tokenIds: number[];
  /** The one token the prefill produced, when the core knows it (ATOM's `first_token_id`). Additive. */
  firstTokenId?: number;
}

export interface PulledKv {
  /** Prompt tokens whose KV now sits locally (to be inserted as computed). */
  tokenIds: number[];
  /** Bytes moved over the side channel (for metrics and tests). */
  bytes: number;
}

/** What the sim core offers its connector. */
export interface SimKvHost {
  readonly engineId: string;
  readonly blockSize: number;
  /** Bytes of KV one block holds for the simulated model (payload sizing for transfers). */
  readonly kvBytesPerBlock: number;
  readonly host: string;
  readonly httpPort: number;
  readonly tpSize: number;
  readonly dpSize: number;
  readonly dpRank: number;
  /** Keeps a finished prefill request's blocks allocated; returns what is held. */
  holdBlocks(requestId: string): HeldKv | null;
  getHeld(requestId: string): HeldKv | null;
  /** Frees held blocks (after the pull, on expiry, or on failure). Idempotent. */
  releaseHeld(requestId: string): void;
  /** Decode side: allocates and stores blocks for `tokenIds` as if computed locally. */
  importBlocks(requestId: string, tokenIds: readonly number[]): { importedTokens: number };
}

export interface SimConnector {
  readonly kind: ConnectorKind;
  /** Starts side-channel listeners (bootstrap server, handshake port, ...). */
  start(): Promise<void>;
  close(): Promise<void>;
  /** Prefill side: the `kv_transfer_params` the response carries (Nixl, MoRIIO, ATOM); null for fire-and-forget protocols. */
  onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<Record<string, unknown> | null>;
  /** Decode side: pulls P's KV for this request; throws a typed error on failure or timeout. */
  pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv>;
  /** Extra HTTP routes the engine serves for this connector (e.g. ATOM `GET /kv_transfer_info`). */
  httpRoutes?(): Record<string, () => unknown>;
  /**
   * Additive. Which PD path a request takes on this worker: "prefill" (compute, hold, answer with
   * params), "decode" (pull, import, decode) or null (an ordinary request). The core should call it
   * when present instead of reading `kv_transfer_params` itself: SGLang bootstrap requests carry
   * `bootstrap_room` at the top level and no `kv_transfer_params` at all.
   */
  pdPhase?(body: Record<string, unknown>): "prefill" | "decode" | null;
  /**
   * Additive. Checks a PD request before it is scheduled; throws a typed error (e.g. 400
   * BadRequestError: Mooncake's P drops a request without `transfer_id`).
   */
  validate?(req: PdRequestInfo, phase: "prefill" | "decode"): void;
  /** Additive. The side-channel ports actually bound (after start), for the worker record / logs. */
  describe?(): SimConnectorDescription;
}

/** What a started connector listens on (mirrors discovery's ConnectorInfo). */
export interface SimConnectorDescription {
  kind: ConnectorKind;
  bootstrapHost: string;
  /** Mooncake / SGLang bootstrap port, Nixl side-channel port. */
  bootstrapPort?: number;
  /** MoRIIO / ATOM handshake port. */
  handshakePort?: number;
  /** MoRIIO notify port. */
  notifyPort?: number;
}

export interface SimConnectorOptions {
  kind: ConnectorKind;
  role: "mixed" | "prefill" | "decode";
  /** Parsed `--kv-transfer-config` JSON. */
  kvTransferConfig: Record<string, unknown>;
  /** How long P holds blocks waiting for D's pull. */
  holdTimeoutMs: number;
}
