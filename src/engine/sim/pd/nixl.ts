/**
 * vLLM NixlConnector, serial, D pulls (engine-protocols.md §4a). P listens on its side-channel
 * port (`VLLM_NIXL_SIDE_CHANNEL_PORT`, default 5600, + dp rank; the sim also reads
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
import { BadRequestError, UpstreamError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { configNumber, configString, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

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
    const host = paramString(p, "remote_host");
    const port = paramNumber(p, "remote_port");
    if (!host || !port) {
      throw new BadRequestError(
        "kv_transfer_params.remote_host and remote_port are required with do_remote_prefill",
        "kv_transfer_params",
      );
    }
    const key = paramString(p, "remote_request_id") ?? req.requestId;
    const groups = blockGroups(p.remote_block_ids);
    return this.pull(sideChannelUrl(host, port, key), req, { signal, blockIds: groups?.flat() });
  }
}

/**
 * `remote_block_ids` as vLLM's D reads it: one list of block ids per KV cache group. Absent →
 * undefined (the sim then pulls whatever P holds); a flat list or non-integers fail the load
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
