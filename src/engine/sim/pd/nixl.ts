/**
 * vLLM NixlConnector, serial, D pulls (docs/engine-protocols.md#pd-nixl). P listens on its
 * side-channel port (`VLLM_NIXL_SIDE_CHANNEL_PORT`, default 5600, + dp rank; the sim also reads
 * `kv_connector_extra_config.side_channel_port`, 0 = any free port) and answers the prefill
 * with the params D needs; D pulls exactly `remote_block_ids` of `remote_request_id` from
 * `remote_host:remote_port`.
 *
 * Shapes follow vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/nixl/
 * pull_scheduler.py @ 0050936b22adda2ef0197fa3bb2551fe6c5437dc (`request_finished`):
 * `remote_block_ids` is one list per KV cache group (the sim has one group: full attention),
 * `remote_num_tokens` the prefill's computed tokens, plus `dcp_size`, `pp_size`,
 * `remote_blocks_expiry_time` (None on P) and `transfer_mode` "pull". D's worker indexes
 * `meta.remote.block_ids` per group (nixl/metadata.py @ 02cfb534df5674737558730b10f23d1b7aef9b7c,
 * `RemoteMeta.block_ids: BlockIds`), so a flat list is a failed KV load, not a transfer.
 */
import { InferaError, TimeoutError, UpstreamError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { configNumber, configString, paramNumber, paramString } from "./config.ts";
import { abortableSleep, sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

/** The params vLLM's D checks by key (`update_state_after_alloc`) before it loads remote KV. */
const REQUIRED = ["remote_engine_id", "remote_request_id", "remote_host", "remote_port"] as const;

export class NixlSimConnector extends SideChannelConnector {
  readonly kind = "nixl" as const;

  private get sideChannelHost(): string {
    return (
      configString(this.opts, ["side_channel_host"], ["VLLM_NIXL_SIDE_CHANNEL_HOST"]) ?? this.advertisedHost
    );
  }

  async start(): Promise<void> {
    // kv_both (role mixed) workers may serve prefills too, so they listen like P.
    if (this.opts.role === "decode") return;
    const base = configNumber(this.opts, ["side_channel_port"], ["VLLM_NIXL_SIDE_CHANNEL_PORT"], 5600);
    await this.channel.listen(base === 0 ? 0 : base + this.host.dpRank, this.bindHost);
    this.started = true;
  }

  describe(): SimConnectorDescription {
    return {
      kind: this.kind,
      bootstrapHost: this.sideChannelHost,
      bootstrapPort: this.channel.port || undefined,
    };
  }

  async onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<Record<string, unknown>> {
    this.channel.offer(req.requestId, held);
    return {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: [held.blockIds],
      remote_engine_id: this.host.engineId,
      remote_request_id: req.requestId,
      remote_host: this.sideChannelHost,
      remote_port: this.channel.port,
      tp_size: this.host.tpSize,
      dcp_size: 1,
      pp_size: 1,
      remote_num_tokens: held.tokenIds.length,
      remote_blocks_expiry_time: null,
      transfer_mode: "pull",
    };
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    const p = req.params;
    const groups = blockGroups(p.remote_block_ids);
    if (!groups || groups.length === 0) {
      // update_state_after_alloc: without remote_block_ids vLLM asserts num_external_tokens == 0,
      // which a remote prefill with prompt tokens to load breaks (an engine-side failure).
      throw new InferaError(
        500,
        "AssertionError: do_remote_prefill without remote_block_ids (num_external_tokens must be 0)",
        { code: "internal_server_error", param: "kv_transfer_params.remote_block_ids" },
      );
    }
    const missing = REQUIRED.filter((k) => !(k in p));
    if (missing.length > 0) {
      // vLLM logs "Got invalid KVTransferParams … will not utilize KVTransfer" but the request
      // already waits for remote KV that nobody will send: it never completes. The sim gives up
      // at its pull timeout.
      this.log.warn(
        { params: p, missing },
        "Got invalid KVTransferParams. This request will not utilize KVTransfer",
      );
      await abortableSleep(this.settings.pullTimeoutMs, signal);
      throw new TimeoutError(
        `KV for request ${req.requestId} never arrived: kv_transfer_params lacks ${missing.join(", ")}`,
      );
    }
    const host = paramString(p, "remote_host");
    const port = paramNumber(p, "remote_port");
    if (!host || !port) {
      throw new UpstreamError(
        `KV load failed: no NIXL peer at remote_host ${String(p.remote_host)}, remote_port ${String(p.remote_port)}`,
        502,
        "kv_transfer_failed",
      );
    }
    const key = paramString(p, "remote_request_id") ?? req.requestId;
    return this.pull(sideChannelUrl(host, port, key), req, { signal, blockIds: groups.flat() });
  }
}

/**
 * `remote_block_ids` as vLLM's D reads it: one list of block ids per KV cache group. Absent →
 * undefined; a flat list or non-integers fail the load
 * the way vLLM's worker does (a failed transfer → the request errors under the default
 * `kv_load_failure_policy: "fail"`, vllm/config/kv_transfer.py).
 */
export function blockGroups(v: unknown): number[][] | undefined {
  if (v === undefined || v === null) return undefined;
  const ok =
    Array.isArray(v) &&
    v.every((g) => Array.isArray(g) && g.every((b) => typeof b === "number" && Number.isInteger(b)));
  if (!ok) {
    throw new UpstreamError(
      `KV load failed: remote_block_ids must be one list of block ids per KV cache group, got ${JSON.stringify(v).slice(0, 80)}`,
      502,
      "kv_transfer_failed",
    );
  }
  return v as number[][];
}
