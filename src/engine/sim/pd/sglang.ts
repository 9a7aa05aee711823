/**
 * SGLang bootstrap disaggregation, concurrent with identical bodies (engine-protocols.md §4d).
 * The router adds `bootstrap_host`, `bootstrap_port`, `bootstrap_room` at the top level of the
 * body and sends it to P and D at once. P serves its bootstrap listener on
 * `--disaggregation-bootstrap-port` (read from the kv-transfer config's `bootstrap_port` /
 * `disaggregation_bootstrap_port`, env `SGLANG_DISAGGREGATION_BOOTSTRAP_PORT`, default 8998);
 * D pulls the room's KV from it, waiting while P is still computing.
 */
import { BadRequestError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { configNumber, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

export class SglangSimConnector extends SideChannelConnector {
  readonly kind = "sglang" as const;

  async start(): Promise<void> {
    if (this.opts.role !== "prefill") return;
    const port = configNumber(
      this.opts,
      ["bootstrap_port", "disaggregation_bootstrap_port"],
      ["SGLANG_DISAGGREGATION_BOOTSTRAP_PORT"],
      8998,
    );
    await this.channel.listen(port, this.bindHost);
    this.started = true;
  }

  describe(): SimConnectorDescription {
    return {
      kind: this.kind,
      bootstrapHost: this.advertisedHost,
      bootstrapPort: this.channel.port || undefined,
    };
  }

  /** SGLang marks PD requests by the bootstrap fields alone; the worker's role says which half. */
  override pdPhase(body: Record<string, unknown>): "prefill" | "decode" | null {
    if (body.bootstrap_room === undefined || body.bootstrap_room === null) return super.pdPhase(body);
    if (this.opts.role === "prefill") return "prefill";
    if (this.opts.role === "decode") return "decode";
    return null;
  }

  private room(req: PdRequestInfo): string {
    const room = paramString(req.body, "bootstrap_room");
    if (!room)
      throw new BadRequestError("bootstrap_room is required for disaggregated requests", "bootstrap_room");
    return room;
  }

  override validate(req: PdRequestInfo, phase: "prefill" | "decode"): void {
    this.room(req);
    if (
      phase === "decode" &&
      (!paramString(req.body, "bootstrap_host") || !paramNumber(req.body, "bootstrap_port"))
    ) {
      throw new BadRequestError(
        "bootstrap_host and bootstrap_port are required on the decode side",
        "bootstrap_host",
      );
    }
  }

  async onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<null> {
    this.channel.offer(this.room(req), held);
    return null;
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    this.validate(req, "decode");
    const host = paramString(req.body, "bootstrap_host")!;
    const port = paramNumber(req.body, "bootstrap_port")!;
    return this.pull(sideChannelUrl(host, port, this.room(req)), req, {
      signal,
      waitMs: this.settings.pullTimeoutMs,
    });
  }
}
