/**
 * etcd registrar: puts one worker record under a lease (keep-alive every TTL/3 by the etcd3
 * client), re-grants and re-puts when the lease is lost (etcd restart, long outage), and
 * revokes it on graceful stop.
 */
import type { Etcd3, Lease } from "etcd3";
import { createLogger, type Logger } from "../util/log.ts";
import {
  type Backoff,
  createEtcdClient,
  DEFAULT_BACKOFF,
  type EtcdOptions,
  errText,
  normalizePrefix,
  sleep,
} from "./etcd-client.ts";
import { type DiscoveryRegistrar, type WorkerRecord, workerKey } from "./types.ts";

export interface EtcdRegistrarOptions extends EtcdOptions {
  /** Lease TTL in seconds (etcd minimum 1). Default 10. */
  leaseTtlSeconds?: number;
  backoff?: Backoff;
  logger?: Logger;
  client?: Etcd3;
}

export class EtcdRegistrar implements DiscoveryRegistrar {
  private readonly opts: EtcdRegistrarOptions;
  private readonly client: Etcd3;
  private readonly ownsClient: boolean;
  private readonly log: Logger;
  private readonly ttl: number;
  private readonly backoff: Backoff;
  private record: WorkerRecord | null = null;
  private lease: Lease | null = null;
  private regranting = false;
  private stopped = false;
  /** Leases granted so far (1 after register; more after each loss); for tests and logs. */
  grants = 0;

  constructor(opts: EtcdRegistrarOptions) {
    this.opts = opts;
    this.client = opts.client ?? createEtcdClient(opts);
    this.ownsClient = opts.client === undefined;
    this.log = opts.logger ?? createLogger("registrar-etcd");
    this.ttl = Math.max(1, Math.round(opts.leaseTtlSeconds ?? 10));
    this.backoff = opts.backoff ?? DEFAULT_BACKOFF;
  }

  key(): string | null {
    return this.record ? workerKey(normalizePrefix(this.opts.prefix), this.record) : null;
  }

  /** Puts the record under a fresh lease; rejects if etcd cannot be reached right now. */
  async register(record: WorkerRecord): Promise<void> {
    this.stopped = false;
    const old = this.lease;
    this.record = record;
    if (old && !old.revoked()) {
      // Same lease, new value (e.g. re-register after a health flap).
      await old.put(this.key() as string).value(JSON.stringify(record));
      return;
    }
    await this.grantAndPut();
  }

  async deregister(): Promise<void> {
    this.stopped = true;
    const lease = this.lease;
    this.lease = null;
    if (!lease) return;
    try {
      await lease.revoke();
      this.log.info({ key: this.key() }, "worker deregistered (lease revoked)");
    } catch (err) {
      // etcd unreachable: the record goes when the lease's TTL runs out.
      this.log.warn({ err: errText(err), ttl: this.ttl }, "lease revoke failed; record expires with its TTL");
    }
  }

  async close(): Promise<void> {
    if (this.lease) await this.deregister();
    this.stopped = true;
    if (this.ownsClient) this.client.close();
  }

  private async grantAndPut(): Promise<void> {
    const record = this.record;
    if (!record) return;
    const lease = this.client.lease(this.ttl);
    lease.on("lost", (err: Error) => this.onLeaseLost(lease, err));
    try {
      await lease.grant();
      await lease.put(this.key() as string).value(JSON.stringify(record));
    } catch (err) {
      lease.release();
      throw err;
    }
    if (this.stopped) {
      await lease.revoke().catch(() => undefined);
      return;
    }
    this.lease = lease;
    this.grants++;
    this.log.info({ key: this.key(), ttl: this.ttl, grants: this.grants }, "worker registered");
  }

  private onLeaseLost(lease: Lease, err: unknown): void {
    if (this.stopped || this.lease !== lease) return;
    this.lease = null;
    this.log.warn({ err: errText(err) }, "etcd lease lost; re-granting");
    void this.regrant();
  }

  private async regrant(): Promise<void> {
    if (this.regranting) return;
    this.regranting = true;
    let delay = this.backoff.initialMs;
    try {
      while (!this.stopped && this.lease === null) {
        try {
          await this.grantAndPut();
        } catch (err) {
          this.log.debug({ err: errText(err), retryMs: delay }, "lease re-grant failed");
          await sleep(delay);
          delay = Math.min(delay * 2, this.backoff.maxMs);
        }
      }
    } finally {
      this.regranting = false;
    }
  }
}
