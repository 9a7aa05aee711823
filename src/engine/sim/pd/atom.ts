/**
 * ATOM's serial relay (docs/engine-protocols.md#pd-atom). P's answer is ATOM's
 * `seq.kv_transfer_params_output` (ROCm/ATOM atom/kv_transfer/disaggregation/moriio/
 * moriio_connector.py @ ffdf3bb5d, scheduler-side `request_finished`): `remote_port` is the
 * scheduler's own handshake port (never the HTTP port), `remote_handshake_port` the configured
 * base, `remote_engine_id` the scheduler's "None", `transfer_id` the sequence id (an int),
 * plus `tp_size`, `dp_rank`, `first_token_id`, `draft_token_ids`, `prefix_cache_hit_tokens`.
 * D reads `remote_dp_size`, `remote_dp_rank`, `remote_tp_size` with defaults 1 / 0 / 0
 * (atom/kv_transfer/disaggregation/types.py `_build_req_meta`), so their absence is no error.
 * Both sides serve `GET /kv_transfer_info` on the engine's HTTP port: ATOM's four fields
 * `{tp_size, dp_size, kv_role, handshake_port}`. P listens on the kv-transfer config's
 * `handshake_port` (default 6301, + dp rank; 0 = free port) and D pulls by `transfer_id` from
 * `remote_host:remote_handshake_port + remote_dp_rank`.
 */
import { BadRequestError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { configNumber, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

export class AtomSimConnector extends SideChannelConnector {
  readonly kind = "atom" as const;
  private handshakePort = 0;
  /** ATOM's transfer id is the prefill's sequence id: an int counting up per engine. */
  private nextSeqId = Math.floor(Math.random() * 1e6);

  /** The configured base port (`handshake_port`, default 6301); a rank listens on base + dp rank. */
  private baseHandshakePort = 0;

  async start(): Promise<void> {
    const base = configNumber(this.opts, ["handshake_port"], [], 6301);
    // side_channel_port = handshake_port + get_port_offset(dp_rank, tp_rank) (0 = a free port).
    this.handshakePort = base === 0 ? 0 : base + this.host.dpRank;
    this.baseHandshakePort = base;
    if (this.opts.role !== "prefill") return;
    this.handshakePort = await this.channel.listen(this.handshakePort, this.bindHost);
    if (base === 0) this.baseHandshakePort = this.handshakePort - this.host.dpRank;
    this.started = true;
  }

  describe(): SimConnectorDescription {
    return { kind: this.kind, bootstrapHost: this.advertisedHost, handshakePort: this.handshakePort };
  }

  /** ATOM's `GET /kv_transfer_info` (atom/entrypoints/openai/api_server.py @ ffdf3bb5d): four fields. */
  httpRoutes(): Record<string, () => unknown> {
    return {
      "/kv_transfer_info": () => ({
        tp_size: this.host.tpSize,
        dp_size: this.host.dpSize,
        kv_role: this.opts.role === "prefill" ? "kv_producer" : "kv_consumer",
        handshake_port: this.baseHandshakePort,
      }),
    };
  }

  async onPrefillFinished(_req: PdRequestInfo, held: HeldKv): Promise<Record<string, unknown>> {
    const transferId = this.nextSeqId++;
    this.channel.offer(String(transferId), held);
    return {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: held.blockIds,
      remote_engine_id: "None",
      remote_host: this.advertisedHost,
      remote_port: this.handshakePort,
      remote_handshake_port: this.baseHandshakePort,
      tp_size: this.host.tpSize,
      dp_rank: this.host.dpRank,
      transfer_id: transferId,
      first_token_id: held.firstTokenId ?? null,
      draft_token_ids: [],
      prefix_cache_hit_tokens: 0,
    };
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    const p = req.params;
    const host = paramString(p, "remote_host");
    const port = paramNumber(p, "remote_handshake_port");
    const transferId = paramString(p, "transfer_id");
    if (!host || !port || !transferId) {
      throw new BadRequestError(
        "ATOM decode needs kv_transfer_params.remote_host, remote_handshake_port and transfer_id",
        "kv_transfer_params",
      );
    }
    // D dials remote_handshake_port + get_port_offset(remote_dp_rank, tp_rank); absent → rank 0.
    const dataPort = port + (paramNumber(p, "remote_dp_rank") ?? 0);
    const blockIds = Array.isArray(p.remote_block_ids) ? (p.remote_block_ids as number[]) : undefined;
    return this.pull(sideChannelUrl(host, dataPort, transferId), req, { signal, blockIds });
  }
}
