/** `infera kvd`: wires the arena, tiers, listeners, metrics and the sweep timer together. */
import { chmodSync, chownSync, existsSync, lstatSync, readFileSync, unlinkSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { envVar } from "../config/env-table.ts";
import { createLogger, type Logger } from "../util/log.ts";
import { type AisStatus, probeAis } from "./ais.ts";
import { type ArenaMapping, createArena } from "./arena.ts";
import {
  ConnGuard,
  DEFAULT_AUTH_TIMEOUT_MS,
  DEFAULT_MAX_TCP_PER_PEER,
  DEFAULT_PRE_AUTH_FRAME_BYTES,
  defaultMaxTcpConnections,
} from "./conn-guard.ts";
import { createKvdMetrics } from "./metrics.ts";
import { type ServeContext, serveConnection } from "./server.ts";
import { newSocketReadStats } from "./socket-reader.ts";
import { TieredStore } from "./store.ts";
import { DiskTier } from "./tiers/disk.ts";
import { openRemote, type RemoteTier } from "./tiers/remote.ts";
import type { KvdConfig } from "./types.ts";

export interface KvdDaemon {
  readonly store: TieredStore;
  readonly socketPath?: string;
  readonly tcpPort?: number;
  readonly metricsPort?: number;
  readonly ais: AisStatus;
  stats(): Record<string, unknown>;
  close(): Promise<void>;
}

function resolveGid(group: string): number {
  if (/^\d+$/.test(group)) return Number(group);
  for (const line of readFileSync("/etc/group", "utf8").split("\n")) {
    const [name, , gid] = line.split(":");
    if (name === group && gid) return Number(gid);
  }
  throw new Error(`unknown group "${group}"`);
}

/** Removes a stale socket file left by a dead daemon; refuses if a live one answers. */
async function clearStaleSocket(path: string): Promise<void> {
  if (!existsSync(path)) return;
  if (!lstatSync(path).isSocket()) throw new Error(`${path} exists and is not a socket`);
  const alive = await new Promise<boolean>((resolve) => {
    const s = net.connect(path, () => {
      s.destroy();
      resolve(true);
    });
    s.on("error", () => resolve(false));
  });
  if (alive) throw new Error(`another kvd is listening on ${path}`);
  unlinkSync(path);
}

function listen(
  server: net.Server | http.Server,
  arg: string | { host: string; port: number },
): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    const done = () => {
      server.off("error", reject);
      resolve();
    };
    if (typeof arg === "string") server.listen(arg, done);
    else server.listen(arg.port, arg.host, done);
  });
}

/** 127.0.0.0/8, ::1, their IPv4-mapped forms and "localhost": reachable from this host only. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (h === "localhost" || h === "::1" || h === "0:0:0:0:0:0:0:1") return true;
  const v4 = h.startsWith("::ffff:") ? h.slice(7) : h;
  return net.isIPv4(v4) && v4.startsWith("127.");
}

export const DEFAULT_MAX_QUEUED_BYTES = 64 * 1024 * 1024;

export async function startKvd(cfg: KvdConfig, log: Logger = createLogger("kvd")): Promise<KvdDaemon> {
  const tcpToken = cfg.tcpToken === "" ? undefined : cfg.tcpToken;
  // The TCP port answers every op on every namespace to whoever reaches it; without a token
  // only processes on this host can.
  if (cfg.tcp && !tcpToken && !isLoopbackHost(cfg.tcp.host))
    throw new Error(
      `refusing to listen on ${cfg.tcp.host}:${cfg.tcp.port} without a token: kvd's TCP port has no other ` +
        "authentication; give a token (--tcp-token-file / INFERA_KVD_TCP_TOKEN) or bind 127.0.0.1",
    );
  const ais = probeAis(cfg.ais ?? envVar("INFERA_KVD_AIS") === "1");
  log.info({ ais }, ais.active ? "kvd AIS GPU-direct path on" : "kvd AIS GPU-direct path off");
  const { arena, disk, remote, store } = await openTiers(cfg, log);
  const { ctx, clients } = serveContext(cfg, store, ais, tcpToken, log);
  const { guard, stats } = ctx;

  const servers: net.Server[] = [];
  const sockets = new Set<net.Socket>();
  const track = (s: net.Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  };
  if (cfg.socketPath) {
    servers.push(
      await listenUnix(cfg.socketPath, cfg.socketGroup, (s) => {
        track(s);
        serveConnection(s, ctx, "unix");
      }),
    );
  }
  let tcpPort: number | undefined;
  if (cfg.tcp) {
    const srv = net.createServer((s) => {
      if (!guard.admit(s)) return;
      track(s);
      s.setNoDelay(true);
      serveConnection(s, ctx, "tcp");
    });
    await listen(srv, cfg.tcp);
    tcpPort = (srv.address() as net.AddressInfo).port;
    servers.push(srv);
  }
  const metricsServer =
    cfg.metricsPort === undefined
      ? undefined
      : await listenMetrics(createKvdMetrics(store, clients, ais, guard), cfg.metricsHost, cfg.metricsPort);
  const metricsPort = metricsServer ? (metricsServer.address() as net.AddressInfo).port : undefined;
  const sweep = setInterval(() => store.sweep(), cfg.sweepMs ?? 1000);
  sweep.unref();

  log.info(
    {
      socket: cfg.socketPath,
      tcp: tcpPort,
      tcpAuth: cfg.tcp ? (tcpToken ? "token" : "none (loopback only)") : undefined,
      tcpLimits: cfg.tcp ? guard.limits : undefined,
      metricsPort,
      ramBytes: cfg.ramBytes,
      disk: disk ? { dir: disk.dir, bytes: disk.capacity, chunks: disk.index.size } : null,
      remote: cfg.remoteUrl ?? null,
      ephemeral: cfg.ephemeral ?? false,
    },
    "kvd ready",
  );

  let closing: Promise<void> | null = null;
  return {
    store,
    socketPath: cfg.socketPath,
    tcpPort,
    metricsPort,
    ais,
    stats,
    close() {
      closing ??= (async () => {
        clearInterval(sweep);
        for (const s of servers) s.close();
        for (const s of sockets) s.destroy();
        metricsServer?.close();
        await store.drain();
        await remote?.close();
        if (cfg.socketPath && existsSync(cfg.socketPath)) unlinkSync(cfg.socketPath);
        // The mapping stays: in-flight socket writes may still reference arena views.
        arena.close(false);
      })();
      return closing;
    },
  };
}

/** L2 (the arena), L3 (disk) and L4 (remote) as configured, and the store over them. */
async function openTiers(cfg: KvdConfig, log: Logger) {
  const arena: ArenaMapping = createArena(cfg.ramBytes);
  log.info({ bytes: cfg.ramBytes, fd: arena.fd }, "kvd L2 arena created (memfd, sealed, MAP_SHARED)");
  let disk: DiskTier | undefined;
  if (cfg.diskDir && !cfg.ephemeral && cfg.diskBytes > 0) {
    disk = new DiskTier(cfg.diskDir, cfg.diskBytes, log);
    disk.open();
  }
  let remote: RemoteTier | undefined;
  if (cfg.remoteUrl && !cfg.ephemeral) {
    remote = await openRemote(cfg.remoteUrl);
    log.info({ url: cfg.remoteUrl }, "kvd L4 remote store connected");
  }
  const store = new TieredStore({ arena, disk, remote, ephemeral: cfg.ephemeral, log });
  return { arena, disk, remote, store };
}

/** What every connection shares: the store, the TCP guard, limits, counters and STATS. */
function serveContext(
  cfg: KvdConfig,
  store: TieredStore,
  ais: AisStatus,
  tcpToken: string | undefined,
  log: Logger,
): { ctx: ServeContext; clients: () => number } {
  let clients = 0;
  const reads = newSocketReadStats();
  const guard = new ConnGuard(
    {
      maxTcpConnections: cfg.maxTcpConnections ?? defaultMaxTcpConnections(),
      maxTcpPerPeer: cfg.maxTcpPerPeer ?? DEFAULT_MAX_TCP_PER_PEER,
      authTimeoutMs: cfg.authTimeoutMs ?? DEFAULT_AUTH_TIMEOUT_MS,
      preAuthFrameBytes: cfg.preAuthFrameBytes ?? DEFAULT_PRE_AUTH_FRAME_BYTES,
    },
    log,
  );
  const stats = () => ({
    ...store.stats(),
    clients,
    ais,
    tcp: { connections: guard.tcp, refused: { ...guard.refused } },
    socket_reads: {
      direct_connections: reads.directConnections,
      data_event_connections: reads.dataEventConnections,
      into_reservation_bytes: reads.intoSinkBytes,
      copied_bytes: reads.copiedBytes,
    },
  });
  const ctx: ServeContext = {
    store,
    guard,
    log,
    maxFrameBytes: cfg.maxFrameBytes ?? 256 * 1024 * 1024,
    stats,
    directRead: cfg.directRead ?? envVar("INFERA_KVD_DIRECT_READ") !== "0",
    reads,
    tcpToken,
    maxQueuedBytes: cfg.maxQueuedBytes ?? DEFAULT_MAX_QUEUED_BYTES,
    onClientCount: (d: number) => {
      clients += d;
    },
  };
  return { ctx, clients: () => clients };
}

/** The Unix socket, mode 0600 from its first instant (0660 with a group). */
async function listenUnix(
  path: string,
  group: string | undefined,
  onConnection: (s: net.Socket) => void,
): Promise<net.Server> {
  await clearStaleSocket(path);
  const srv = net.createServer(onConnection);
  // The socket file is created by bind(): a tight umask makes it 0600 from its first
  // instant, so there is no window in which another user could connect.
  // Node binds a pipe synchronously inside listen(), so the umask is restored before any
  // other code of this process runs.
  const old = process.umask(0o177);
  let listening: Promise<void>;
  try {
    listening = listen(srv, path);
  } finally {
    process.umask(old);
  }
  await listening;
  if (group) {
    chownSync(path, process.getuid?.() ?? 0, resolveGid(group));
    chmodSync(path, 0o660);
  } else chmodSync(path, 0o600);
  return srv;
}

/** GET /metrics (Prometheus) and /health, on their own port. */
async function listenMetrics(
  registry: ReturnType<typeof createKvdMetrics>,
  host: string | undefined,
  port: number,
): Promise<http.Server> {
  const server = http.createServer((req, res) => {
    if (req.url === "/metrics") {
      registry.metrics().then(
        (body) => res.writeHead(200, { "content-type": registry.contentType }).end(body),
        () => res.writeHead(500).end(),
      );
    } else if (req.url === "/health")
      res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}');
    else res.writeHead(404).end();
  });
  await listen(server, { host: host ?? "127.0.0.1", port });
  return server;
}
