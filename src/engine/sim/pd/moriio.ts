/**
 * vLLM MoRIIOConnector (docs/engine-protocols.md#pd-moriio), as vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_connector.py
 * @ 0158326ccc22cff86725bbaa452df5e6be966c5c and moriio_common.py
 * @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03 define it:
 *
 * - Config (`kv_connector_extra_config`): `proxy_ip`, `proxy_ping_port` and `http_port` are read
 *   without defaults (`MoRIIOConfig.from_vllm_config`), so a worker missing one refuses to start
 *   with `KeyError: '<key>'`; `handshake_port` / `notify_port` default to 6301 / 61005
 *   (`_set_port_defaults`; the sim keeps 0 = a free port for tests). A rank's notify port is
 *   `notify_port + dp_rank*1 + tp_rank` and its handshake listener `handshake_port + same offset`
 *   (`get_port_offset`). `read_mode` ("true"/"1", default false) picks READ; WRITE is the
 *   default (`get_moriio_mode`); the old env var is ignored.
 * - Registration (`_ping`): ZMQ DEALER → proxy ROUTER on `proxy_ip:proxy_ping_port`, a msgpack
 *   map `{type: "P"|"D", http_address: "<ip>:<http_port>", zmq_address:
 *   "host:<ip>,handshake:<handshake_port>,notify:<notify port>", dp_size, tp_size,
 *   transfer_mode: "READ"|"WRITE"}` every 3 s (`MoRIIOConstants.PING_INTERVAL`).
 * - Every request with `kv_transfer_params` reads `params["transfer_id"]` in
 *   `update_state_after_alloc`, on P and on D: without it the engine raises
 *   `KeyError: 'transfer_id'`; the sim answers 500 naming the field.
 * - P's answer (`request_finished`): `do_remote_prefill, do_remote_decode, remote_block_ids,
 *   remote_engine_id ("<ip>:<handshake_port>"), remote_host, remote_handshake_port,
 *   remote_notify_port, remote_dp_size, tp_size, transfer_id` (echoed).
 * - Peer addresses come from `kv_transfer_params` (`remote_host`, `remote_handshake_port`,
 *   `remote_notify_port`, `remote_dp_rank`) or, when absent, from the router's request id
 *   `___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}` (`get_peer_zmq_from_request_id`,
 *   a ValueError when neither is there).
 * - READ: serial; D reads P's blocks by transfer_id from P's handshake port, then notifies P
 *   (P frees on that notify). WRITE: P and D run at once; D tells P where its blocks are
 *   (`send_notify_block`: `{req_id, transfer_id, block_notify_list, decode_rank,
 *   type: "remote_blocks"}` to P's notify port) and P moves the KV when its prefill is done.
 *   The sim's data path is still D's pull from P's side channel (waiting for P), started after
 *   that notify; P frees the blocks once moved.
 */
import { pack, unpack } from "msgpackr";
import * as zmq from "zeromq";
import { InferaError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { configNumber, extraConfig, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

export interface MoriioZmqAddress {
  host: string;
  handshakePort: number;
  notifyPort: number;
}

/** Parses `host:IP,handshake:P,notify:P` (each pair split on its first colon, as vLLM does). */
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

const REQUEST_ID_FORM = /^___prefill_addr_(.+?)___decode_addr_(.+?)_([0-9a-f]{32})(?:-.*)?$/;

/** The prefill and decode addresses carried in a MoRIIO-form request id, if it has that form. */
export function parseMoriioRequestId(id: string): { prefill: string; decode: string; uuid: string } | null {
  const m = REQUEST_ID_FORM.exec(id);
  return m ? { prefill: m[1], decode: m[2], uuid: m[3] } : null;
}

/** The Python `KeyError` vLLM's MoRIIO code raises for a missing key. */
export class MoriioKeyError extends Error {
  readonly key: string;
  constructor(key: string) {
    super(`KeyError: '${key}'`);
    this.key = key;
    this.name = "KeyError";
  }
}

/** A request the engine cannot run: vLLM raises inside the engine, the API answers 500. */
export class MoriioEngineError extends InferaError {
  constructor(message: string, param: string | null) {
    super(500, message, { type: "server_error", param, code: "internal_server_error" });
  }
}

export class MoriioSimConnector extends SideChannelConnector {
  readonly kind = "moriio" as const;
  private notifySock: zmq.Router | null = null;
  private register: zmq.Dealer | null = null;
  private registerTimer: NodeJS.Timeout | null = null;
  private readonly dealers = new Map<string, zmq.Dealer>();
  private readonly sendChains = new Map<string, Promise<void>>();
  /** Base ports (the config values); listeners bind base + dp rank. */
  private handshakeBase = 0;
  private notifyBase = 0;
  private handshakePort = 0;
  private notifyPort = 0;
  private readMode = false;
  private localIp = "127.0.0.1";
  private httpPort = 0;
  /** WRITE mode, P: transfer ids whose D has announced its blocks (for logs and tests). */
  readonly announced = new Set<string>();

  private required(key: string): unknown {
    const extra = extraConfig(this.opts);
    if (!(key in extra)) throw new MoriioKeyError(key);
    return extra[key];
  }

  async start(): Promise<void> {
    const extra = extraConfig(this.opts);
    // MoRIIOConfig.from_vllm_config reads these three without defaults.
    const proxyIp = String(this.required("proxy_ip"));
    const proxyPingPort = Number(this.required("proxy_ping_port"));
    this.httpPort = Number(this.required("http_port"));
    this.readMode = ["true", "1"].includes(
      String(extra.read_mode ?? "false")
        .toLowerCase()
        .trim(),
    );
    this.localIp = typeof extra.host_ip === "string" && extra.host_ip ? extra.host_ip : this.advertisedHost;
    const offset = this.host.dpRank; // get_port_offset(dp_rank, tp_rank=0)
    const hsCfg = configNumber(this.opts, ["handshake_port"], [], 6301);
    const ntCfg = configNumber(this.opts, ["notify_port"], [], 61005);
    this.handshakePort = hsCfg === 0 ? 0 : hsCfg + offset;
    this.notifyPort = ntCfg === 0 ? 0 : ntCfg + offset;
    if (this.opts.role === "prefill") {
      this.handshakePort = await this.channel.listen(this.handshakePort, this.bindHost);
    }
    this.notifySock = new zmq.Router({ linger: 0 });
    await this.notifySock.bind(`tcp://${this.bindHost}:${this.notifyPort || "*"}`);
    const ep = this.notifySock.lastEndpoint ?? "";
    this.notifyPort = Number(ep.slice(ep.lastIndexOf(":") + 1)) || this.notifyPort;
    this.handshakeBase = hsCfg === 0 ? this.handshakePort - offset : hsCfg;
    this.notifyBase = ntCfg === 0 ? this.notifyPort - offset : ntCfg;
    void this.readNotifies(this.notifySock);
    this.started = true;
    this.startRegistration(proxyIp, proxyPingPort);
  }

  /** vLLM's MoRIIO engine id: `<host ip>:<handshake_port>`. */
  get engineId(): string {
    return `${this.localIp}:${this.handshakeBase}`;
  }

  get mode(): "READ" | "WRITE" {
    return this.readMode ? "READ" : "WRITE";
  }

  private async readNotifies(sock: zmq.Router): Promise<void> {
    try {
      for await (const frames of sock) {
        const last = frames[frames.length - 1];
        let msg: unknown;
        try {
          msg = unpack(last) as unknown;
        } catch {
          msg = last.toString("utf8");
        }
        if (typeof msg === "string") {
          this.channel.release(msg, "notified");
          continue;
        }
        if (!msg || typeof msg !== "object") continue;
        const m = msg as Record<string, unknown>;
        const tid = typeof m.transfer_id === "string" ? m.transfer_id : undefined;
        if (m.type === "remote_blocks" && tid) this.announced.add(tid);
        else if (tid) this.channel.release(tid, "notified");
      }
    } catch (err) {
      if (this.started) this.log.warn({ err }, "MoRIIO notify socket stopped");
    }
  }

  private startRegistration(proxyIp: string, proxyPort: number): void {
    if (!proxyIp) return; // `if self._rank == 0 and self.moriio_config.proxy_ip`
    const sock = new zmq.Dealer({ linger: 0, sendTimeout: 0 });
    sock.connect(`tcp://${proxyIp}:${proxyPort}`);
    this.register = sock;
    const msg = pack({
      type: this.opts.role === "prefill" ? "P" : "D",
      http_address: `${this.localIp}:${this.httpPort}`,
      zmq_address: `host:${this.localIp},handshake:${this.handshakeBase},notify:${this.notifyPort}`,
      dp_size: this.host.dpSize,
      tp_size: this.host.tpSize,
      transfer_mode: this.mode,
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
    for (const p of this.dealers.values()) p.close();
    this.dealers.clear();
    await super.close();
  }

  describe(): SimConnectorDescription {
    return {
      kind: this.kind,
      bootstrapHost: this.localIp,
      handshakePort: this.handshakePort,
      notifyPort: this.notifyPort,
    };
  }

  /** `params["transfer_id"]`: a KeyError inside vLLM's engine, a 500 at its API. */
  private transferId(req: PdRequestInfo): string {
    const id = paramString(req.params, "transfer_id");
    if (!id) {
      throw new MoriioEngineError(
        "KeyError: 'transfer_id' (MoRIIOConnector needs kv_transfer_params.transfer_id)",
        "kv_transfer_params.transfer_id",
      );
    }
    return id;
  }

  /** The peer's address: kv_transfer_params first, else the router's request-id form. */
  private peer(req: PdRequestInfo, peerIsPrefill: boolean): MoriioZmqAddress {
    const p = req.params;
    const host = paramString(p, "remote_host");
    const hs = paramNumber(p, "remote_handshake_port");
    const nt = paramNumber(p, "remote_notify_port");
    if (host && hs !== undefined && nt !== undefined) return { host, handshakePort: hs, notifyPort: nt };
    const form = parseMoriioRequestId(req.requestId);
    const addr = form ? parseMoriioZmqAddress(peerIsPrefill ? form.prefill : form.decode) : null;
    if (!addr) {
      throw new MoriioEngineError(
        `ValueError: Cannot parse peer zmq_address from request_id: '${req.requestId}'`,
        "kv_transfer_params",
      );
    }
    return addr;
  }

  override validate(req: PdRequestInfo, phase: "prefill" | "decode"): void {
    this.transferId(req);
    // WRITE mode: P must know where D is (it pushes there); D always needs P.
    if (phase === "decode" || !this.readMode) this.peer(req, phase === "decode");
  }

  async onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<Record<string, unknown>> {
    const transferId = this.transferId(req);
    this.channel.offer(transferId, held, this.readMode ? "on-notify" : "after-pull");
    return {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: held.blockIds,
      remote_engine_id: this.engineId,
      remote_host: this.localIp,
      remote_handshake_port: this.handshakeBase,
      remote_notify_port: this.notifyBase,
      remote_dp_size: this.host.dpSize,
      tp_size: this.host.tpSize,
      transfer_id: transferId,
    };
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    const transferId = this.transferId(req);
    const peer = this.peer(req, true);
    const offset = paramNumber(req.params, "remote_dp_rank") ?? 0;
    const dataPort = peer.handshakePort + offset;
    const notifyPort = peer.notifyPort + offset;
    if (!this.readMode) {
      // WRITE: announce D's blocks to P, then receive what P moves once its prefill is done.
      await this.notify(peer.host, notifyPort, {
        req_id: req.requestId,
        transfer_id: transferId,
        block_notify_list: [],
        decode_rank: this.host.dpRank,
        type: "remote_blocks",
      });
      return this.pull(sideChannelUrl(peer.host, dataPort, transferId), req, {
        signal,
        waitMs: this.settings.pullTimeoutMs,
      });
    }
    const blockIds = Array.isArray(req.params.remote_block_ids)
      ? (req.params.remote_block_ids as number[])
      : undefined;
    const pulled = await this.pull(sideChannelUrl(peer.host, dataPort, transferId), req, {
      signal,
      blockIds,
    });
    await this.notify(peer.host, notifyPort, { transfer_id: transferId, type: "release" });
    return pulled;
  }

  /** A msgpack map to a peer's notify ROUTER (best effort: P also expires held blocks). */
  private async notify(host: string, port: number, msg: Record<string, unknown>): Promise<void> {
    const ep = `tcp://${host}:${port}`;
    let sock = this.dealers.get(ep);
    if (!sock) {
      sock = new zmq.Dealer({ linger: 2000, sendTimeout: 1000 });
      sock.connect(ep);
      this.dealers.set(ep, sock);
    }
    // zeromq allows one send in flight per socket: chain them.
    const s = sock;
    const next = (this.sendChains.get(ep) ?? Promise.resolve()).then(() =>
      s.send(pack(msg)).catch((err: unknown) => {
        this.log.warn({ err, ep }, "MoRIIO notify failed; P will expire the blocks");
      }),
    );
    this.sendChains.set(ep, next);
    await next;
  }
}
