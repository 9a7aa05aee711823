/**
 * What all sim connectors share: the side-channel listener on P, the pull on D, the
 * settings, and the default PD-phase rule (`kv_transfer_params.do_remote_decode` → prefill,
 * `do_remote_prefill` → decode). Each protocol module adds its own keys, ports and params.
 */
import type { ConnectorKind } from "../../../discovery/types.ts";
import { createLogger, type Logger } from "../../../util/log.ts";
import { type TransferSettings, transferSettings } from "./config.ts";
import { importableTokens, type PullOptions, pullKv } from "./pull-client.ts";
import { KvSideChannel } from "./side-channel.ts";
import type {
  HeldKv,
  PdRequestInfo,
  PulledKv,
  SimConnector,
  SimConnectorDescription,
  SimConnectorOptions,
  SimKvHost,
} from "./types.ts";

export abstract class SideChannelConnector implements SimConnector {
  protected readonly opts: SimConnectorOptions;
  protected readonly host: SimKvHost;
  abstract readonly kind: ConnectorKind;
  protected readonly settings: TransferSettings;
  protected readonly log: Logger;
  protected readonly channel: KvSideChannel;
  protected started = false;

  constructor(opts: SimConnectorOptions, host: SimKvHost) {
    this.opts = opts;
    this.host = host;
    this.settings = transferSettings(opts);
    this.log = createLogger("sim-pd", { connector: opts.kind, role: opts.role, engine: host.engineId });
    this.channel = new KvSideChannel(host, this.settings, this.log);
  }

  /** Opens the protocol's listeners; P-side only ones are skipped on a pure decode worker. */
  abstract start(): Promise<void>;

  async close(): Promise<void> {
    await this.channel.close();
  }

  abstract onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<Record<string, unknown> | null>;
  abstract pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv>;
  abstract describe(): SimConnectorDescription;

  pdPhase(body: Record<string, unknown>): "prefill" | "decode" | null {
    const p = body.kv_transfer_params;
    if (!p || typeof p !== "object") return null;
    const params = p as Record<string, unknown>;
    if (params.do_remote_prefill === true) return "decode";
    if (params.do_remote_decode === true) return "prefill";
    return null;
  }

  validate(_req: PdRequestInfo, _phase: "prefill" | "decode"): void {}

  /** The address peers use to reach this worker's side channels. */
  protected get advertisedHost(): string {
    const h = this.host.host;
    return h === "0.0.0.0" || h === "::" || h === "" ? "127.0.0.1" : h;
  }

  protected get bindHost(): string {
    return this.host.host || "127.0.0.1";
  }

  /** Pulls from P, checks the tokens against D's prompt, and logs the transfer. */
  protected async pull(
    url: string,
    req: PdRequestInfo,
    opts: Omit<PullOptions, "timeoutMs">,
  ): Promise<PulledKv> {
    const started = performance.now();
    const res = await pullKv(url, { ...opts, timeoutMs: this.settings.pullTimeoutMs });
    const tokenIds = importableTokens(res.header.tokenIds, req.promptTokenIds);
    this.log.debug(
      {
        requestId: req.requestId,
        from: res.header.engineId,
        tokens: tokenIds.length,
        kvBytes: res.header.kvBytes,
        bytes: res.bytes,
        ms: Math.round(performance.now() - started),
      },
      "pulled KV",
    );
    return { tokenIds, bytes: res.bytes };
  }
}
