/**
 * Server replicas found through etcd, for the routing state they share (src/router/peers,
 * wired by src/server/peer-plane.ts): each replica puts its announce endpoint under
 * `<prefix>/peers/<replica id>` with its own lease (gone within the lease's TTL when the replica
 * dies) and watches `<prefix>/peers/`, following every endpoint that appears and dropping those
 * whose key goes. Worker records live under `<prefix>/workers/`, so discovery never sees these.
 *
 * A lost lease (etcd restart, long outage) is re-granted and the key put again; while etcd is
 * away the mesh keeps the peers it has.
 */
import type { Etcd3, Lease, Watcher } from "etcd3";
import type { Logger } from "../util/log.ts";
import { errText, normalizePrefix, sleep } from "./etcd-client.ts";

export interface EtcdPeersOptions {
  client: Etcd3;
  /** The discovery prefix (`/infera` by default). */
  prefix?: string;
  replicaId: string;
  /** Where peers reach this replica's PUB. */
  endpoint: string;
  leaseTtlSeconds?: number;
  addPeer(endpoint: string): void;
  removePeer(endpoint: string): void;
  logger: Logger;
}

export function peersPrefix(prefix: string | undefined): string {
  return `${normalizePrefix(prefix)}/peers/`;
}

export class EtcdPeers {
  private readonly o: EtcdPeersOptions;
  private readonly keyPrefix: string;
  private readonly key: string;
  private lease: Lease | null = null;
  private watcher: Watcher | null = null;
  /** Key → endpoint of the peers followed. */
  private readonly peers = new Map<string, string>();
  private stopped = false;

  constructor(o: EtcdPeersOptions) {
    this.o = o;
    this.keyPrefix = peersPrefix(o.prefix);
    this.key = `${this.keyPrefix}${encodeURIComponent(o.replicaId)}`;
  }

  async start(): Promise<void> {
    await this.register();
    const w = await this.o.client.watch().prefix(this.keyPrefix).create();
    this.watcher = w;
    w.on("put", (kv) => this.put(kv.key.toString(), kv.value.toString()));
    w.on("delete", (kv) => this.remove(kv.key.toString()));
    const all = await this.o.client.getAll().prefix(this.keyPrefix).strings();
    for (const [k, v] of Object.entries(all)) this.put(k, v);
  }

  private put(key: string, value: string): void {
    if (this.stopped || key === this.key) return;
    let endpoint: unknown;
    try {
      endpoint = (JSON.parse(value) as { endpoint?: unknown }).endpoint;
    } catch {
      return;
    }
    if (typeof endpoint !== "string" || !/^tcp:\/\/[^\s]+:\d+$/.test(endpoint)) return;
    const old = this.peers.get(key);
    if (old === endpoint) return;
    if (old) this.o.removePeer(old);
    this.peers.set(key, endpoint);
    this.o.addPeer(endpoint);
    this.o.logger.info({ peer: key.slice(this.keyPrefix.length), endpoint }, "peer replica found");
  }

  private remove(key: string): void {
    const endpoint = this.peers.get(key);
    if (!endpoint) return;
    this.peers.delete(key);
    this.o.removePeer(endpoint);
    this.o.logger.info({ peer: key.slice(this.keyPrefix.length) }, "peer replica gone");
  }

  private async register(): Promise<void> {
    const lease = this.o.client.lease(Math.max(1, this.o.leaseTtlSeconds ?? 10));
    lease.on("lost", (err: Error) => void this.onLost(lease, err));
    await lease.grant();
    await lease.put(this.key).value(JSON.stringify({ endpoint: this.o.endpoint, replica: this.o.replicaId }));
    this.lease = lease;
  }

  private async onLost(lease: Lease, err: Error): Promise<void> {
    if (this.stopped || this.lease !== lease) return;
    this.lease = null;
    this.o.logger.warn({ err: errText(err) }, "peer lease lost; re-registering");
    for (let delay = 200; !this.stopped && this.lease === null; delay = Math.min(delay * 2, 5000)) {
      try {
        await this.register();
      } catch {
        await sleep(delay);
      }
    }
  }

  async close(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await this.watcher?.cancel().catch(() => undefined);
    await this.lease?.revoke().catch(() => undefined);
  }
}
