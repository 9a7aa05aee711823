/**
 * vLLM NixlConnector, serial, D pulls (engine-protocols.md §4a). P listens on its side-channel
 * port (`VLLM_NIXL_SIDE_CHANNEL_PORT`, default 5600, + dp rank; the sim also reads
 * `kv_connector_extra_config.side_channel_port`, 0 = any free port) and answers the prefill
 * with the params D needs; D pulls exactly `remote_block_ids` of `remote_request_id` from
 * `remote_host:remote_port`.
 */
import { BadRequestError } from "../../../protocol/errors.ts";
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
      remote_block_ids: held.blockIds,
      remote_engine_id: this.host.engineId,
      remote_request_id: req.requestId,
      remote_host: this.sideChannelHost,
      remote_port: this.channel.port,
      tp_size: this.host.tpSize,
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
    const blockIds = Array.isArray(p.remote_block_ids) ? (p.remote_block_ids as number[]) : undefined;
    return this.pull(sideChannelUrl(host, port, key), req, { signal, blockIds });
  }
}
