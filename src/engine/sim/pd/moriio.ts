/**
 * vLLM MoRIIOConnector in READ (pull) mode (engine-protocols.md §4c). Settings come from
 * `kv_connector_extra_config`: `proxy_ip`, `proxy_ping_port`, `http_port`, `handshake_port`
 * (6301), `notify_port` (61005), `read_mode`. P serves the KV on its handshake port and
 * frees a request's blocks when D's notify (ZMQ PUSH → P's PULL on the notify port) names
 * it, on a failed pull, or on the hold timeout. With `proxy_ip`/`proxy_ping_port` set, the
 * worker registers with the proxy (a ZMQ DEALER re-sending a msgpack map every 3 s).
 * D reads P's address from `kv_transfer_params` or, as newer versions do, from the request
 * id `___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}`.
 */
import { pack, unpack } from "msgpackr";
import * as zmq from "zeromq";
import { BadRequestError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { configBool, configNumber, configString, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

export interface MoriioZmqAddress {
  host: string;
  handshakePort: number;
  notifyPort: number;
}

/** Parses `host:IP,handshake:P,notify:P`. */
export function parseMoriioZmqAddress(s: string): MoriioZmqAddress | null {
  const parts = new Map<string, string>();
  for (const kv of s.split(",")) {
    const i = kv.indexOf(":");
    if (i > 0) parts.set(kv.slice(0, i).trim(), kv.slice(i + 1).trim());
  }
  const host = parts.get("host");
  const hs = Number(parts.get("handshake"));
  const nt = Number(parts.get("notify"));
  return host && hs > 0 && nt > 0 ? { host, handshakePort: hs, notifyPort: nt } : null;
}

const REQUEST_ID_FORM = /^___prefill_addr_(.+?)___decode_addr_(.+?)_([0-9a-f]{32})$/;

/** The prefill and decode addresses carried in a MoRIIO-form request id, if it has that form. */
export function parseMoriioRequestId(id: string): { prefill: string; decode: string; uuid: string } | null {
  const m = REQUEST_ID_FORM.exec(id);
  return m ? { prefill: m[1], decode: m[2], uuid: m[3] } : null;
}

export class MoriioSimConnector extends SideChannelConnector {
  readonly kind = "moriio" as const;
  private notifySock: zmq.Pull | null = null;
  private register: zmq.Dealer | null = null;
  private registerTimer: NodeJS.Timeout | null = null;
  private readonly pushes = new Map<string, zmq.Push>();
  private readonly sendChains = new Map<string, Promise<void>>();
  private handshakePort = 0;
  private notifyPort = 0;

  private get readMode(): boolean {
    return configBool(this.opts, ["read_mode"], ["VLLM_MORIIO_CONNECTOR_READ_MODE"]) ?? true;
  }

  async start(): Promise<void> {
    this.handshakePort = configNumber(this.opts, ["handshake_port"], [], 6301);
    this.notifyPort = configNumber(this.opts, ["notify_port"], [], 61005);
    if (!this.readMode) this.log.warn("MoRIIO WRITE mode is not simulated; serving READ (pull) mode");
    if (this.opts.role === "prefill") {
      this.handshakePort = await this.channel.listen(this.handshakePort, this.bindHost);
      this.notifySock = new zmq.Pull({ linger: 0 });
      await this.notifySock.bind(`tcp://${this.bindHost}:${this.notifyPort || "*"}`);
      const ep = this.notifySock.lastEndpoint ?? "";
      this.notifyPort = Number(ep.slice(ep.lastIndexOf(":") + 1)) || this.notifyPort;
      void this.readNotifies(this.notifySock);
    }
    this.startRegistration();
    this.started = true;
  }

  private async readNotifies(sock: zmq.Pull): Promise<void> {
    try {
      for await (const frames of sock) {
        const last = frames[frames.length - 1];
        let ids: string[] = [];
        try {
          const msg = unpack(last) as unknown;
          if (typeof msg === "string") ids = [msg];
          else if (msg && typeof msg === "object") {
            const m = msg as Record<string, unknown>;
            if (typeof m.req_id === "string") ids.push(m.req_id);
            if (Array.isArray(m.req_ids))
              ids.push(...m.req_ids.filter((x): x is string => typeof x === "string"));
          }
        } catch {
          ids = [last.toString("utf8")];
        }
        for (const id of ids) this.channel.release(id, "notified");
      }
    } catch (err) {
      if (this.started) this.log.warn({ err }, "MoRIIO notify socket stopped");
    }
  }

  private zmqAddress(): string {
    return `host:${this.advertisedHost},handshake:${this.handshakePort},notify:${this.notifyPort}`;
  }

  private startRegistration(): void {
    const proxyIp = configString(this.opts, ["proxy_ip"], []);
    const proxyPort = configNumber(this.opts, ["proxy_ping_port"], [], 0);
    if (!proxyIp || !proxyPort) return;
    const sock = new zmq.Dealer({ linger: 0, sendTimeout: 0 });
    sock.connect(`tcp://${proxyIp}:${proxyPort}`);
    this.register = sock;
    const httpPort = configNumber(this.opts, ["http_port"], [], this.host.httpPort);
    const msg = pack({
      type: this.opts.role === "prefill" ? "P" : "D",
      http_address: `${this.advertisedHost}:${httpPort}`,
      zmq_address: this.zmqAddress(),
      dp_size: this.host.dpSize,
      tp_size: this.host.tpSize,
      transfer_mode: this.readMode ? "READ" : "WRITE",
    });
    const ping = () => {
      // A DEALER with no peer yet refuses at once (sendTimeout 0); the next ping retries.
      sock.send(msg).catch(() => {});
    };
    ping();
    this.registerTimer = setInterval(ping, configNumber(this.opts, ["sim_ping_interval_ms"], [], 3000));
    this.registerTimer.unref();
  }

  override async close(): Promise<void> {
    this.started = false;
    if (this.registerTimer) clearInterval(this.registerTimer);
    this.register?.close();
    this.notifySock?.close();
    for (const p of this.pushes.values()) p.close();
    this.pushes.clear();
    await super.close();
  }

  describe(): SimConnectorDescription {
    return {
      kind: this.kind,
      bootstrapHost: this.advertisedHost,
      handshakePort: this.handshakePort,
      notifyPort: this.notifyPort,
    };
  }

  async onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<Record<string, unknown>> {
    this.channel.offer(req.requestId, held, "on-notify");
    return {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: this.host.engineId,
      remote_block_ids: held.blockIds,
      remote_request_id: req.requestId,
      remote_host: this.advertisedHost,
      remote_handshake_port: this.handshakePort,
      remote_notify_port: this.notifyPort,
      remote_dp_size: this.host.dpSize,
      remote_tp_size: this.host.tpSize,
      remote_dp_rank: this.host.dpRank,
      tp_size: this.host.tpSize,
    };
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    const p = req.params;
    const fromId = parseMoriioRequestId(req.requestId);
    const addr = fromId ? parseMoriioZmqAddress(fromId.prefill) : null;
    const host = paramString(p, "remote_host") ?? addr?.host;
    const hs = paramNumber(p, "remote_handshake_port") ?? addr?.handshakePort;
    const nt = paramNumber(p, "remote_notify_port") ?? addr?.notifyPort;
    if (!host || !hs || !nt) {
      throw new BadRequestError(
        "MoRIIO read mode needs remote_host, remote_handshake_port and remote_notify_port (or the request-id form)",
        "kv_transfer_params",
      );
    }
    const key = paramString(p, "remote_request_id") ?? req.requestId;
    const blockIds = Array.isArray(p.remote_block_ids) ? (p.remote_block_ids as number[]) : undefined;
    const pulled = await this.pull(sideChannelUrl(host, hs, key), req, { signal, blockIds });
    await this.notify(host, nt, key);
    return pulled;
  }

  /** Tells P the read is done so it frees the blocks (best effort: P also expires them). */
  private async notify(host: string, port: number, key: string): Promise<void> {
    const ep = `tcp://${host}:${port}`;
    let sock = this.pushes.get(ep);
    if (!sock) {
      sock = new zmq.Push({ linger: 2000, sendTimeout: 1000 });
      sock.connect(ep);
      this.pushes.set(ep, sock);
    }
    // zeromq allows one send in flight per socket: chain them.
    const s = sock;
    const next = (this.sendChains.get(ep) ?? Promise.resolve()).then(() =>
      s.send(pack({ req_id: key, engine_id: this.host.engineId })).catch((err: unknown) => {
        this.log.warn({ err, ep }, "MoRIIO notify failed; P will expire the blocks");
      }),
    );
    this.sendChains.set(ep, next);
    await next;
  }
}
