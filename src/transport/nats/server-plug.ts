/**
 * How `infera server` plugs the NATS planes in through its extension seams
 * (src/server/extension-api.ts): a request-plane executor factory, and a KV-ingest factory for
 * `--event-plane nats`. Each opens its own NATS connection from `config.nats` and closes it on
 * close(), so the server's lifecycle needs nothing NATS-specific.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import type {
  ExecutorFactory,
  KvIngest,
  KvIngestFactory,
  ManagedExecutor,
  PeerPlaneFactory,
  ServerComponentContext,
} from "../../server/extension-api.ts";
import { peerSecret, startPeerMesh } from "../../server/peer-plane.ts";
import { HttpExecutor } from "../http.ts";
import { NatsRequestExecutor } from "./client.ts";
import { connectNats, type NatsConnectOptions } from "./connection.ts";
import { NatsKvIngest } from "./kv-ingest.ts";
import { NatsPeerTransport } from "./peer-transport.ts";

/** The NATS settings a server config carries (`nats` key, from --nats-* flags or INFERA_NATS_*). */
function natsOptions(ctx: ServerComponentContext, role: string): NatsConnectOptions {
  const cfg = ctx.config as { nats?: NatsConnectOptions };
  if (!cfg.nats?.url) throw new Error("the NATS planes need --nats-url (or INFERA_NATS_URL)");
  return {
    ...cfg.nats,
    name: cfg.nats.name ?? `infera-server-${role}-${process.pid}`,
    logger: ctx.logger,
    registry: ctx.registry,
  };
}

/**
 * `--request-plane nats`. Workers whose record has no `natsSubject` (launched without a NATS
 * request plane, e.g. during a rolling change) are reached over HTTP, so a mixed fleet works.
 */
export const createNatsExecutor: ExecutorFactory = async (ctx) => {
  const natsOpts = natsOptions(ctx, "req");
  const nc = await connectNats(natsOpts);
  const exec = new NatsRequestExecutor({
    nc,
    reconnectWaitMs: natsOpts.reconnectWaitMs,
    logger: ctx.logger.child({ plane: "nats" }),
  });
  const http = new HttpExecutor(ctx.config.upstream);
  const managed: ManagedExecutor = {
    send: (w, endpoint, body, opts) =>
      w.record.natsSubject ? exec.send(w, endpoint, body, opts) : http.send(w, endpoint, body, opts),
    forget: (url) => http.forget(url),
    close: async () => {
      exec.close();
      await http.close();
      await nc.close().catch(() => {});
    },
  };
  return managed;
};

/**
 * `--event-plane nats`: the KV index fed from the agents' relays instead of each engine's ZMQ.
 * As the ZMQ ingest, the server calls it only when its scheduling profiles need the index.
 */
export const createNatsKvIngest: KvIngestFactory = async (ctx) => {
  const nc: NatsConnection = await connectNats(natsOptions(ctx, "kv"));
  const ingest = new NatsKvIngest({
    nc,
    watcher: ctx.discovery,
    logger: ctx.logger,
    registry: ctx.registry,
    maxBlocksPerWorker: ctx.config.ingest.kvMaxBlocksPerWorker,
  });
  ingest.start();
  const out: KvIngest & { inner: NatsKvIngest } = {
    inner: ingest,
    // One index for all models: workers are keyed by id, and lookups name their candidates.
    indexFor: () => ingest.index,
    syncReport: () => ingest.syncReport(),
    close: async () => {
      await ingest.close();
      await nc.close().catch(() => {});
    },
  };
  return out;
};

/**
 * Wraps the server's ZMQ KV-ingest factory: `--event-plane nats` (config.eventPlane) takes the
 * NATS one instead. With `zmq` undefined (none registered) the other planes get no index.
 */
export function selectKvIngestFactory(zmq: KvIngestFactory | undefined): KvIngestFactory {
  return (ctx) => {
    const plane = (ctx.config as { eventPlane?: string }).eventPlane;
    if (plane === "nats") return createNatsKvIngest(ctx);
    // No ZMQ ingest registered: no index, so kv-aware falls back to its approximate tree.
    if (!zmq) return { indexFor: () => undefined, close: async () => {} };
    return zmq(ctx);
  };
}

/**
 * Wraps the server's ZMQ peer-plane factory: with `--event-plane nats` replicas share routing
 * state on `infera.route.<model>` (./peer-transport.ts) unless `peers.enabled` is false.
 */
export function selectPeerPlaneFactory(zmq: PeerPlaneFactory): PeerPlaneFactory {
  return async (ctx) => {
    const plane = (ctx.config as { eventPlane?: string }).eventPlane;
    if (plane !== "nats" || ctx.config.peers?.enabled === false) return zmq(ctx);
    const secret = peerSecret(ctx);
    const nc = await connectNats(natsOptions(ctx, "peers"));
    return startPeerMesh(ctx, new NatsPeerTransport(nc, true), secret);
  };
}
