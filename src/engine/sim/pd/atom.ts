/**
 * ATOM's serial relay (engine-protocols.md §4e). Both sides serve `GET /kv_transfer_info`
 * on the engine's HTTP port (tp/dp sizes, engine id, handshake port). P listens on the
 * kv-transfer config's `handshake_port` (default 6301, 0 = free port), answers the prefill
 * with the params D needs (including a `transfer_id` and the prefill's `first_token_id`),
 * and D pulls by `transfer_id` from `remote_host:remote_handshake_port`.
 */
import { randomUUID } from "node:crypto";
import { BadRequestError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { configNumber, configString, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

export class AtomSimConnector extends SideChannelConnector {
  readonly kind = "atom" as const;
  private handshakePort = 0;

  async start(): Promise<void> {
    this.handshakePort = configNumber(this.opts, ["handshake_port"], [], 6301);
    if (this.opts.role !== "prefill") return;
    this.handshakePort = await this.channel.listen(this.handshakePort, this.bindHost);
    this.started = true;
  }

  describe(): SimConnectorDescription {
    return { kind: this.kind, bootstrapHost: this.advertisedHost, handshakePort: this.handshakePort };
  }

  httpRoutes(): Record<string, () => unknown> {
    return {
      "/kv_transfer_info": () => ({
        engine_id: this.host.engineId,
        kv_role: this.opts.role === "prefill" ? "kv_producer" : "kv_consumer",
        kv_connector: configString(this.opts, ["kv_connector"], []) ?? "moriio",
        host: this.advertisedHost,
        http_port: this.host.httpPort,
        handshake_port: this.handshakePort,
        tp_size: this.host.tpSize,
        dp_size: this.host.dpSize,
        dp_rank: this.host.dpRank,
        block_size: this.host.blockSize,
      }),
    };
  }

  async onPrefillFinished(_req: PdRequestInfo, held: HeldKv): Promise<Record<string, unknown>> {
    const transferId = `atom-${randomUUID()}`;
    this.channel.offer(transferId, held);
    return {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: held.blockIds,
      remote_engine_id: this.host.engineId,
      remote_host: this.advertisedHost,
      remote_port: this.host.httpPort,
      remote_handshake_port: this.handshakePort,
      tp_size: this.host.tpSize,
      dp_rank: this.host.dpRank,
      transfer_id: transferId,
      first_token_id: held.firstTokenId ?? null,
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
    const blockIds = Array.isArray(p.remote_block_ids) ? (p.remote_block_ids as number[]) : undefined;
    return this.pull(sideChannelUrl(host, port, transferId), req, { signal, blockIds });
  }
}
