/**
 * The MoRIIO proxy-registration socket (docs/engine-protocols.md#pd-moriio): a ZMQ ROUTER bound on
 * `proxy_ping_port` (36367 by default) where vLLM MoRIIOConnector workers announce
 * themselves by re-sending a msgpack map every few seconds. Presented as a
 * `DiscoveryWatcher`, so a server can follow MoRIIO workers without etcd: each registration
 * becomes a worker record (role, HTTP URL, handshake/notify ports, dp/tp size), a worker
 * silent for `staleMs` is removed.
 *
 * Accepted messages: `{type: "P"|"D", http_address, zmq_address: "host:IP,handshake:P,notify:P",
 * dp_size, tp_size, transfer_mode}` and the older `{type: "register", role, request_address,
 * handshake_port, notify_port, ...}` (`request_address` may carry a path, e.g.
 * `http://10.0.0.2:9000/v1/completions`: only its host and port are kept). The registered
 * `transfer_mode` goes into the record (`connector.transferMode`): the DisaggRouter runs
 * READ workers serially and WRITE workers concurrently, and pairs only workers of one mode.
 *
 * Every record passes the same schema as the other discovery backends (schema.ts): a
 * registration whose record fails it (a port out of range, `dp_size: 0`, an address that is no
 * host:port) is skipped with one warning naming the worker, repeated only when the error
 * changes, since the worker re-sends the same registration every few seconds.
 */
import { unpack } from "msgpackr";
import * as zmq from "zeromq";
import { createLogger, type Logger } from "../util/log.ts";
import { validateWorkerRecord } from "./schema.ts";
import type { DiscoveryEvent, DiscoveryWatcher, EngineKind, WorkerRecord, WorkerRole } from "./types.ts";

export const MORIIO_DEFAULT_PROXY_PING_PORT = 36367;

/** Bounds the warned-about set: registrations are unauthenticated, ids are sender-chosen. */
const MAX_REJECTED = 1024;

export interface MoriioProxyOptions {
  /** Address to bind (default 127.0.0.1; `0.0.0.0` to accept workers from other hosts). */
  host?: string;
  /** 0 = any free port (read `port` after `start()`). */
  port?: number;
  /** The model the registering workers serve (registrations do not name one). */
  model: string;
  servedModelNames?: string[];
  engine?: EngineKind;
  blockSize?: number;
  maxModelLen?: number;
  /** A worker not heard from for this long is removed (default 15 s: 3–5 missed pings). */
  staleMs?: number;
  logger?: Logger;
}

export interface MoriioRegistration {
  role: Exclude<WorkerRole, "mixed">;
  httpAddress: string;
  host: string;
  handshakePort?: number;
  notifyPort?: number;
  dpSize: number;
  tpSize: number;
  transferMode: "READ" | "WRITE";
}

function num(v: unknown): number | undefined {
  const n = typeof v === "string" ? Number(v) : v;
  return typeof n === "number" && Number.isFinite(n) ? n : undefined;
}

function roleOf(v: unknown): Exclude<WorkerRole, "mixed"> | null {
  const s = typeof v === "string" ? v.toLowerCase() : "";
  if (s === "p" || s === "prefill" || s === "kv_producer") return "prefill";
  if (s === "d" || s === "decode" || s === "kv_consumer") return "decode";
  return null;
}

/** Parses one registration message (either form); null when it is not one. */
export function parseMoriioRegistration(msg: unknown): MoriioRegistration | null {
  if (!msg || typeof msg !== "object" || Array.isArray(msg)) return null;
  const m = msg as Record<string, unknown>;
  // A `role` field names the role whatever the `type` ("register", or "HELLO", which vLLM's
  // router also takes as a registration: vllm-project/router
  // src/routers/http/moriio_service_discovery.rs @ 0f1200d); without one, `type` does.
  const role = roleOf(m.role !== undefined ? m.role : m.type);
  const httpAddress =
    typeof m.http_address === "string"
      ? m.http_address
      : typeof m.request_address === "string"
        ? m.request_address
        : null;
  if (!role || !httpAddress) return null;
  const parts = new Map<string, string>();
  if (typeof m.zmq_address === "string") {
    for (const kv of m.zmq_address.split(",")) {
      const i = kv.indexOf(":");
      if (i > 0) parts.set(kv.slice(0, i).trim(), kv.slice(i + 1).trim());
    }
  }
  const hostPort = hostAndPort(httpAddress);
  const httpHost = hostPort.replace(/:\d+$/, "").replace(/^\[(.*)\]$/, "$1");
  const mode = String(m.transfer_mode ?? "READ").toUpperCase();
  return {
    role,
    httpAddress: hostPort,
    host: parts.get("host") ?? (typeof m.host === "string" ? m.host : httpHost),
    handshakePort: num(parts.get("handshake")) ?? num(m.handshake_port),
    notifyPort: num(parts.get("notify")) ?? num(m.notify_port),
    dpSize: num(m.dp_size) ?? 1,
    tpSize: num(m.tp_size) ?? 1,
    transferMode: mode === "WRITE" ? "WRITE" : "READ",
  };
}

/** `host:port` of an address given as `host:port` or as a URL (with or without a path). */
function hostAndPort(addr: string): string {
  try {
    if (/^https?:\/\//.test(addr)) return new URL(addr).host;
  } catch {
    // not a URL after all: used as it is
  }
  return addr.replace(/\/.*$/, "");
}

export class MoriioProxyDiscovery implements DiscoveryWatcher {
  private readonly o: MoriioProxyOptions;
  private readonly sock = new zmq.Router({ linger: 0 });
  private readonly records = new Map<string, { rec: WorkerRecord; lastSeen: number }>();
  private readonly listeners = new Set<(ev: DiscoveryEvent) => void>();
  /** Worker id → the schema error last warned about, so a re-sent bad registration warns once. */
  private readonly rejected = new Map<string, string>();
  private readonly log: Logger;
  private sweeper: NodeJS.Timeout | null = null;
  private closed = false;
  private boundPort = 0;

  constructor(o: MoriioProxyOptions) {
    this.o = o;
    this.log = o.logger ?? createLogger("moriio-proxy");
  }

  get port(): number {
    return this.boundPort;
  }

  async start(): Promise<void> {
    const host = this.o.host ?? "127.0.0.1";
    const port = this.o.port ?? MORIIO_DEFAULT_PROXY_PING_PORT;
    await this.sock.bind(`tcp://${host}:${port === 0 ? "*" : port}`);
    const ep = this.sock.lastEndpoint ?? "";
    this.boundPort = Number(ep.slice(ep.lastIndexOf(":") + 1)) || port;
    const staleMs = this.o.staleMs ?? 15_000;
    this.sweeper = setInterval(() => this.sweep(staleMs), Math.max(100, staleMs / 3));
    this.sweeper.unref();
    void this.receive();
  }

  workers(): readonly WorkerRecord[] {
    return [...this.records.values()].map((e) => e.rec);
  }

  onChange(listener: (ev: DiscoveryEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.sweeper) clearInterval(this.sweeper);
    this.sock.close();
  }

  private emit(ev: DiscoveryEvent): void {
    for (const l of this.listeners) {
      try {
        l(ev);
      } catch (err) {
        this.log.error({ err }, "discovery listener failed");
      }
    }
  }

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.sock) {
        // [identity, (empty delimiter)?, payload]
        const payload = frames[frames.length - 1];
        let msg: unknown;
        try {
          msg = unpack(payload);
        } catch {
          this.log.warn("undecodable MoRIIO registration ignored");
          continue;
        }
        const reg = parseMoriioRegistration(msg);
        if (!reg) {
          this.log.warn({ msg }, "not a MoRIIO registration; ignored");
          continue;
        }
        this.admit(reg);
      }
    } catch (err) {
      if (!this.closed) this.log.error({ err }, "MoRIIO proxy socket stopped");
    }
  }

  private admit(reg: MoriioRegistration): void {
    const id = `moriio-${reg.role}-${reg.httpAddress}`;
    const prev = this.records.get(id);
    const now = Date.now();
    const rec: WorkerRecord = {
      id,
      model: this.o.model,
      servedModelNames: this.o.servedModelNames ?? [this.o.model],
      engine: this.o.engine ?? "vllm",
      role: reg.role,
      url: `http://${reg.httpAddress}`,
      connector: {
        kind: "moriio",
        bootstrapHost: reg.host,
        handshakePort: reg.handshakePort,
        notifyPort: reg.notifyPort,
        transferMode: reg.transferMode,
      },
      blockSize: this.o.blockSize ?? 16,
      dpSize: reg.dpSize,
      tpSize: reg.tpSize,
      maxModelLen: this.o.maxModelLen ?? 0,
      startedAt: prev?.rec.startedAt ?? new Date(now).toISOString(),
      labels: { registeredVia: "moriio-proxy", transferMode: reg.transferMode },
    };
    const v = validateWorkerRecord(rec);
    if (!v.ok) {
      // Not admitted and not refreshed: a valid record of this id registered earlier ages out.
      if (this.rejected.get(id) !== v.error) {
        if (this.rejected.size >= MAX_REJECTED) this.rejected.clear();
        this.rejected.set(id, v.error);
        this.log.warn({ key: id, error: v.error }, "ignoring invalid worker record");
      }
      return;
    }
    this.rejected.delete(id);
    this.records.set(id, { rec, lastSeen: now });
    if (!prev || JSON.stringify(prev.rec) !== JSON.stringify(rec)) {
      if (!prev) this.log.info({ id, url: rec.url, role: rec.role }, "MoRIIO worker registered");
      this.emit({ type: "put", worker: rec });
    }
  }

  private sweep(staleMs: number): void {
    const now = Date.now();
    for (const [id, e] of this.records) {
      if (now - e.lastSeen <= staleMs) continue;
      this.records.delete(id);
      this.log.warn({ id }, "MoRIIO worker stopped pinging; removed");
      this.emit({ type: "delete", id });
    }
  }
}

/**
 * `--discovery moriio` (src/discovery/index.ts): options from the server config's
 * `discovery.options`: `model` (required), `servedModelNames`, `host`, `port` (default 36367),
 * `staleMs`, `engine`, `blockSize`, `maxModelLen`.
 */
export function createMoriioProxyDiscoveryFromConfig(
  c: { options?: Readonly<Record<string, unknown>> },
  logger: Logger,
): MoriioProxyDiscovery {
  const o = c.options ?? {};
  if (typeof o.model !== "string" || o.model === "") {
    throw new Error("discovery 'moriio' needs discovery.options.model: registrations do not name the model");
  }
  const names = Array.isArray(o.servedModelNames)
    ? o.servedModelNames.filter((n): n is string => typeof n === "string")
    : undefined;
  return new MoriioProxyDiscovery({
    model: o.model,
    servedModelNames: names && names.length > 0 ? names : undefined,
    host: typeof o.host === "string" ? o.host : undefined,
    port: num(o.port),
    staleMs: num(o.staleMs),
    engine: typeof o.engine === "string" ? (o.engine as EngineKind) : undefined,
    blockSize: num(o.blockSize),
    maxModelLen: num(o.maxModelLen),
    logger,
  });
}
