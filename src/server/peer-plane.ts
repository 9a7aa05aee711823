/**
 * How `infera server` starts its peer plane (ServerExtensions.peerPlaneFactory): a ZMQ mesh when
 * `--peers`, `--peers-bind` or `peers.enabled` asks for one (with etcd discovery the peers are
 * also found through etcd, src/discovery/etcd-peers.ts); none otherwise, or with
 * `peers.enabled: false`. With `--event-plane nats` the NATS plug
 * (src/transport/nats/server-plug.ts) takes over and builds the same mesh on a subject.
 *
 * Security: announcements change routing, so they are taken only from rightful senders. The
 * ZMQ mesh binds loopback by default; binding or connecting beyond loopback requires the shared
 * secret (INFERA_PEERS_SECRET or `--peers-secret-file`, never argv), and with a secret every
 * frame is signed and checked (src/router/peers/wire.ts); a peer found through etcd beyond
 * loopback is followed only with a secret too. On NATS the broker's subject permissions apply,
 * and the secret, when set, is checked as well.
 */
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { createEtcdClient, errText } from "../discovery/etcd-client.ts";
import { EtcdPeers } from "../discovery/etcd-peers.ts";
import { etcdOptionsFromConfig } from "../discovery/etcd-watcher.ts";
import { newReplicaId, PeerMesh } from "../router/peers/mesh.ts";
import type { PeerPlane, PeerTransport } from "../router/peers/types.ts";
import { ZmqPeerTransport } from "../router/peers/zmq.ts";
import type { ServerComponentContext } from "./extension-api.ts";

export const PEER_DEFAULTS = {
  bind: "tcp://127.0.0.1:0",
  ttlMs: 15_000,
  maxNodes: 256,
  maxEntriesPerWorker: 4096,
  maxEntries: 65_536,
} as const;

export class PeerConfigError extends Error {
  override readonly name = "PeerConfigError";
  readonly code = "peer_config";
}

/** tcp://127.0.0.1:7300, tcp://localhost:*, tcp://[::1]:7300, ipc://, inproc:// → true. */
export function isLoopbackEndpoint(endpoint: string): boolean {
  if (/^(ipc|inproc):\/\//.test(endpoint)) return true;
  const m = /^tcp:\/\/(\[[^\]]+\]|[^:/]+):[0-9*]+$/.exec(endpoint);
  if (!m) return false;
  const host = m[1].replace(/^\[|\]$/g, "");
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

function readSecret(cfg: { secret?: string; secretFile?: string }): Buffer | null {
  if (cfg.secret) return Buffer.from(cfg.secret, "utf8");
  if (!cfg.secretFile) return null;
  const s = readFileSync(cfg.secretFile, "utf8").trim();
  if (s.length === 0) throw new PeerConfigError(`peers.secretFile ${cfg.secretFile} is empty`);
  return Buffer.from(s, "utf8");
}

/** The shared secret (INFERA_PEERS_SECRET or the secret file), for any transport; null when none. */
export function peerSecret(ctx: ServerComponentContext): Buffer | null {
  return readSecret(ctx.config.peers ?? {});
}

/** A started mesh on `transport` with the config's TTL and bounds. */
export function startPeerMesh(
  ctx: ServerComponentContext,
  transport: PeerTransport,
  secret: Buffer | null,
  extra: { replicaId?: string; onClose?: () => Promise<void> } = {},
): PeerMesh {
  const cfg = ctx.config.peers ?? {};
  const logger = ctx.logger.child({ component: "peers" });
  const mesh = new PeerMesh({
    transport,
    secret,
    ttlMs: cfg.ttlMs ?? PEER_DEFAULTS.ttlMs,
    maxNodes: cfg.maxNodes ?? PEER_DEFAULTS.maxNodes,
    maxEntriesPerWorker: PEER_DEFAULTS.maxEntriesPerWorker,
    maxEntries: PEER_DEFAULTS.maxEntries,
    registry: ctx.registry,
    logger,
    shareLoad: cfg.shareLoad !== false,
    ...extra,
  });
  mesh.start();
  logger.info(
    { replica: mesh.replicaId, endpoint: mesh.endpoint, transport: transport.kind, signed: secret !== null },
    "sharing routing state with peer replicas",
  );
  return mesh;
}

/** The ZMQ mesh, when asked for. */
export async function createPeerPlane(ctx: ServerComponentContext): Promise<PeerPlane | null> {
  const cfg = ctx.config.peers ?? {};
  if (cfg.enabled === false) return null;
  const zmqAsked = cfg.enabled === true || cfg.bind !== undefined || (cfg.connect?.length ?? 0) > 0;
  if (!zmqAsked) return null;
  const secret = readSecret(cfg);
  const bind = cfg.bind ?? PEER_DEFAULTS.bind;
  const connect = cfg.connect ?? [];
  const wide = [bind, ...connect].filter((e) => !isLoopbackEndpoint(e));
  if (wide.length > 0 && !secret) {
    throw new PeerConfigError(
      `peer endpoints beyond loopback (${wide.join(", ")}) need a shared secret: set INFERA_PEERS_SECRET or --peers-secret-file`,
    );
  }
  const t = new ZmqPeerTransport({ bind, connect });
  try {
    await t.start();
  } catch (err) {
    await t.close();
    throw new PeerConfigError(`cannot bind the peer endpoint ${bind}: ${(err as Error).message}`);
  }
  const replicaId = newReplicaId();
  const etcd =
    ctx.config.discovery.kind === "etcd"
      ? await followEtcdPeers(ctx, t, replicaId, cfg.advertise, secret)
      : null;
  return startPeerMesh(ctx, t, secret, { replicaId, onClose: etcd ? () => etcd() : undefined });
}

/** The endpoint peers are told: `advertise`, else the bound one with a wildcard host made this host's name. */
export function advertisedEndpoint(bound: string, advertise: string | undefined): string {
  if (advertise) return advertise;
  return bound.replace(/^tcp:\/\/(0\.0\.0\.0|\*|\[::\])(?=:)/, `tcp://${hostname()}`);
}

/**
 * With etcd discovery: registers this replica's endpoint under its own lease and follows the
 * others (src/discovery/etcd-peers.ts). etcd out of reach leaves the static peers only (a miss, not an error).
 * Returns the closer.
 */
async function followEtcdPeers(
  ctx: ServerComponentContext,
  t: ZmqPeerTransport,
  replicaId: string,
  advertise: string | undefined,
  secret: Buffer | null,
): Promise<(() => Promise<void>) | null> {
  const opts = etcdOptionsFromConfig(ctx.config.discovery);
  const client = createEtcdClient(opts);
  const logger = ctx.logger.child({ component: "peers" });
  const dir = new EtcdPeers({
    client,
    prefix: opts.prefix,
    replicaId,
    endpoint: advertisedEndpoint(t.endpoint, advertise),
    addPeer: (e) => {
      // Unsigned frames are trusted only over loopback.
      if (secret || isLoopbackEndpoint(e)) t.addPeer(e);
      else logger.warn({ endpoint: e }, "peers: not following a non-loopback peer without a shared secret");
    },
    removePeer: (e) => t.removePeer(e),
    logger,
  });
  try {
    await dir.start();
  } catch (err) {
    logger.warn({ err: errText(err) }, "peers: etcd unreachable; sharing only with static --peers");
    await dir.close();
    client.close();
    return null;
  }
  return async () => {
    await dir.close();
    client.close();
  };
}
