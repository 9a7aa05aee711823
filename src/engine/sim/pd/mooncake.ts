/**
 * vLLM MooncakeConnector, concurrent, D pulls via P's bootstrap (engine-protocols.md §4b).
 * P (kv_producer) serves its bootstrap HTTP server on `VLLM_MOONCAKE_BOOTSTRAP_PORT`
 * (default 8998; the sim also reads `kv_connector_extra_config.bootstrap_port`, 0 = free
 * port) with `GET /query`: its engine id, dp/tp sizes and, per dp rank and tp rank, the
 * address of the KV side channel. P and D receive the same `transfer_id`; P drops (400) a
 * PD request without one. D asks the bootstrap server where the KV lives, then pulls it by
 * `transfer_id`, waiting for P to finish when D got there first.
 */
import { BadRequestError, UpstreamError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { JsonHttpServer } from "./bootstrap-server.ts";
import { configNumber, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

interface QueryAnswer {
  engine_id?: string;
  dp_ranks?: Record<
    string,
    { engine_id?: string; tp_ranks?: Record<string, { host: string; port: number }> }
  >;
}

export class MooncakeSimConnector extends SideChannelConnector {
  readonly kind = "mooncake" as const;
  private bootstrap: JsonHttpServer | null = null;

  async start(): Promise<void> {
    if (this.opts.role !== "prefill") return;
    await this.channel.listen(configNumber(this.opts, ["side_channel_port"], [], 0), this.bindHost);
    this.bootstrap = new JsonHttpServer({ "/query": () => this.query() });
    await this.bootstrap.listen(
      configNumber(this.opts, ["bootstrap_port"], ["VLLM_MOONCAKE_BOOTSTRAP_PORT"], 8998),
      this.bindHost,
    );
    this.started = true;
  }

  override async close(): Promise<void> {
    await this.bootstrap?.close();
    await super.close();
  }

  describe(): SimConnectorDescription {
    return { kind: this.kind, bootstrapHost: this.advertisedHost, bootstrapPort: this.bootstrap?.port };
  }

  private query(): QueryAnswer & Record<string, unknown> {
    const tpRanks: Record<string, { host: string; port: number }> = {};
    for (let r = 0; r < this.host.tpSize; r++)
      tpRanks[String(r)] = { host: this.advertisedHost, port: this.channel.port };
    return {
      engine_id: this.host.engineId,
      dp_size: this.host.dpSize,
      tp_size: this.host.tpSize,
      dp_ranks: { [String(this.host.dpRank)]: { engine_id: this.host.engineId, tp_ranks: tpRanks } },
    };
  }

  override validate(req: PdRequestInfo, phase: "prefill" | "decode"): void {
    if (!paramString(req.params, "transfer_id")) {
      throw new BadRequestError(
        "kv_transfer_params.transfer_id is required by MooncakeConnector",
        "kv_transfer_params",
      );
    }
    if (phase === "decode" && !paramString(req.params, "remote_bootstrap_addr")) {
      throw new BadRequestError("kv_transfer_params.remote_bootstrap_addr is required", "kv_transfer_params");
    }
  }

  async onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<null> {
    this.validate(req, "prefill");
    this.channel.offer(paramString(req.params, "transfer_id")!, held);
    return null;
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    this.validate(req, "decode");
    const transferId = paramString(req.params, "transfer_id")!;
    const bootstrap = paramString(req.params, "remote_bootstrap_addr")!.replace(/\/+$/, "");
    const dpRank = String(paramNumber(req.params, "remote_dp_rank") ?? 0);
    let answer: QueryAnswer;
    try {
      const res = await fetch(`${bootstrap}/query`, {
        signal: AbortSignal.any([signal, AbortSignal.timeout(this.settings.pullTimeoutMs)]),
      });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      answer = (await res.json()) as QueryAnswer;
    } catch (err) {
      if (signal.aborted) throw signal.reason ?? err;
      const msg =
        err instanceof Error ? (err.cause instanceof Error ? err.cause.message : err.message) : String(err);
      throw new UpstreamError(
        `Mooncake bootstrap ${bootstrap}/query failed: ${msg}`,
        502,
        "kv_transfer_failed",
      );
    }
    const rank = answer.dp_ranks?.[dpRank] ?? Object.values(answer.dp_ranks ?? {})[0];
    const addr = rank?.tp_ranks?.["0"];
    if (!addr) {
      throw new UpstreamError(
        `Mooncake bootstrap ${bootstrap} lists no worker for dp rank ${dpRank}`,
        502,
        "kv_transfer_failed",
      );
    }
    return this.pull(sideChannelUrl(addr.host, addr.port, transferId), req, {
      signal,
      waitMs: this.settings.pullTimeoutMs,
    });
  }
}
