/**
 * etcd discovery. The watcher lists `<prefix>/workers/` (in pages, at one revision) and
 * watches from the list's revision + 1; on any watch loss it marks itself degraded (keeping
 * the last known set), re-lists with backoff, diffs, and resumes watching. Every value passes
 * the record schema (schema.ts; an invalid one is skipped with one warning per stored value);
 * state is kept per etcd key, and when several keys carry one worker id the key created first
 * is served (keyed-set.ts). This is the server's side; the engine's side (lease, heartbeat,
 * put) is the registrar in etcd-registrar.ts, and what both share (client, flags, backoff) is in
 * etcd-client.ts.
 */

import { type Etcd3, type IKeyValue, Range, type Watcher } from "etcd3";
import { envVar } from "../config/env-table.ts";
import { createLogger, type Logger } from "../util/log.ts";
import {
  type Backoff,
  createEtcdClient,
  DEFAULT_BACKOFF,
  type EtcdOptions,
  errText,
  parseEndpoints,
  sleep,
  workersPrefix,
} from "./etcd-client.ts";
import type { DiscoveryConfig } from "./index.ts";
import { KeyedWorkerSet } from "./keyed-set.ts";
import { parseWorkerRecordText } from "./schema.ts";
import type { DiscoveryEvent, DiscoveryWatcher, WorkerRecord } from "./types.ts";

/** Start-up waits keep the process alive (background retries use `sleep`, which does not). */
const refSleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** etcd3's auth failures (bad credentials, missing permission): retrying cannot fix them. */
function isAuthError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const name = err.constructor?.name ?? err.name;
  return (
    /Authentication|PermissionDenied|Unauthenticated/i.test(name) ||
    /permission denied|authentication failed|invalid auth token|user name is empty/i.test(err.message)
  );
}

export interface EtcdWatcherOptions extends EtcdOptions {
  /** start() rejects (or, with startDegraded, resolves degraded) when the first list has not succeeded by then. Default 10 s (3 s with startDegraded). */
  startTimeoutMs?: number;
  /**
   * When etcd cannot be reached by the start deadline, resolve start() anyway with an empty,
   * degraded set and keep retrying in the background (`restored` follows the first list), so
   * a server comes up, answers /health and reports not-ready instead of exiting. Auth and
   * permission errors still reject: they are misconfiguration, not an outage.
   */
  startDegraded?: boolean;
  backoff?: Backoff;
  logger?: Logger;
  /** Pass a client to share one connection (tests, benchmarks); it is not closed by close(). */
  client?: Etcd3;
  /** Keys per page of the initial list and every re-list. Default 500 (~2 MB of 4 KB records). */
  listPageSize?: number;
}

const DEFAULT_LIST_PAGE = 500;

export class EtcdWatcher implements DiscoveryWatcher {
  private readonly opts: EtcdWatcherOptions;
  private readonly client: Etcd3;
  private readonly ownsClient: boolean;
  private readonly keyPrefix: string;
  private readonly log: Logger;
  private readonly backoff: Backoff;
  /** Every valid record by etcd key; one per worker id is shown (keyed-set.ts). */
  private readonly set: KeyedWorkerSet;
  /** Keys whose invalid value was already reported, with that value's mod revision. */
  private readonly warned = new Map<string, string>();
  /** Worker ids already reported as carried by more than one key. */
  private readonly warnedDuplicate = new Set<string>();
  private readonly pageSize: number;
  private readonly listeners = new Set<(ev: DiscoveryEvent) => void>();
  private watcher: Watcher | null = null;
  private closed = false;
  private degraded = false;
  private resyncing = false;
  /** Number of successful lists (1 after start); for metrics and tests. */
  relists = 0;

  constructor(opts: EtcdWatcherOptions) {
    this.opts = opts;
    this.client = opts.client ?? createEtcdClient(opts);
    this.ownsClient = opts.client === undefined;
    this.keyPrefix = workersPrefix(opts.prefix);
    this.log = opts.logger ?? createLogger("discovery-etcd");
    this.backoff = opts.backoff ?? DEFAULT_BACKOFF;
    this.pageSize = Math.max(1, opts.listPageSize ?? DEFAULT_LIST_PAGE);
    this.set = new KeyedWorkerSet((ev) => this.emit(ev));
  }

  async start(): Promise<void> {
    const degradedStart = this.opts.startDegraded === true;
    const deadline = Date.now() + (this.opts.startTimeoutMs ?? (degradedStart ? 3000 : 10_000));
    let delay = this.backoff.initialMs;
    for (;;) {
      try {
        await this.listAndWatch();
        return;
      } catch (err) {
        if (this.closed) return;
        if (Date.now() + delay > deadline) {
          if (degradedStart && !isAuthError(err)) {
            this.enterDegraded(
              err,
              { endpoints: this.opts.endpoints },
              "etcd unreachable at start; starting with no workers and retrying in the background",
            );
            void this.resync();
            return;
          }
          throw new Error(
            `etcd discovery: could not list ${this.keyPrefix} from ${this.opts.endpoints.join(",")}: ${errText(err)}`,
          );
        }
        await refSleep(delay);
        delay = Math.min(delay * 2, this.backoff.maxMs);
      }
    }
  }

  workers(): readonly WorkerRecord[] {
    return this.set.workers();
  }

  /** True while etcd is unreachable and the last known set is being served. */
  isDegraded(): boolean {
    return this.degraded;
  }

  onChange(listener: (ev: DiscoveryEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async close(): Promise<void> {
    this.closed = true;
    const w = this.watcher;
    this.watcher = null;
    if (w) await w.cancel().catch(() => undefined);
    if (this.ownsClient) this.client.close();
  }

  private emit(ev: DiscoveryEvent): void {
    for (const l of this.listeners) {
      try {
        l(ev);
      } catch (err) {
        this.log.error({ err: errText(err) }, "discovery listener threw");
      }
    }
  }

  private setRecord(kv: IKeyValue): void {
    const key = kv.key.toString();
    const parsed = parseWorkerRecordText(kv.value.toString("utf8"));
    if (!parsed.ok) {
      // A bad value replacing a good one: the key no longer names a usable worker.
      this.set.remove(key);
      // Once per stored value, not once per re-list.
      if (this.warned.get(key) !== kv.mod_revision) {
        this.warned.set(key, kv.mod_revision);
        this.log.warn({ key, error: parsed.error }, "ignoring invalid worker record");
      }
      return;
    }
    this.warned.delete(key);
    this.set.set(key, parsed.record, BigInt(kv.create_revision));
    const dups = this.set.duplicates(parsed.record.id);
    if (dups.length > 0 && !this.warnedDuplicate.has(parsed.record.id)) {
      this.warnedDuplicate.add(parsed.record.id);
      this.log.warn(
        { id: parsed.record.id, keys: dups },
        "worker id registered under several keys; serving the one created first",
      );
    } else if (dups.length === 0) this.warnedDuplicate.delete(parsed.record.id);
  }

  private removeKey(key: string): void {
    this.warned.delete(key);
    this.set.remove(key);
  }

  /**
   * The whole registry at one revision, a page at a time: one response for 10,000 records
   * of 4 KB would be 40 MB, over any sane gRPC message limit (the default 4 MiB failed with
   * RESOURCE_EXHAUSTED at ~1,000 records and left a fresh server with no workers).
   */
  private async listAll(): Promise<{ kvs: IKeyValue[]; revision: string }> {
    const end = Range.prefix(this.keyPrefix).end;
    let start: Buffer = Buffer.from(this.keyPrefix);
    let revision: string | undefined;
    const kvs: IKeyValue[] = [];
    for (;;) {
      const b = this.client.getAll().inRange({ start, end }).limit(this.pageSize);
      if (revision !== undefined) b.revision(revision);
      const res = await b.exec();
      revision ??= res.header.revision;
      for (const kv of res.kvs) kvs.push(kv);
      const last = res.kvs[res.kvs.length - 1];
      if (!res.more || !last || this.closed) return { kvs, revision };
      // The next page starts just after the last key of this one.
      start = Buffer.concat([last.key, Buffer.from([0])]);
    }
  }

  /** One list + diff + watch from the list's revision + 1. Throws when etcd is unreachable. */
  private async listAndWatch(): Promise<void> {
    const res = await this.listAll();
    if (this.closed) return;
    const listed = new Set<string>();
    for (const kv of res.kvs) listed.add(kv.key.toString());
    for (const key of this.set.keys()) if (!listed.has(key)) this.removeKey(key);
    for (const key of [...this.warned.keys()]) if (!listed.has(key)) this.warned.delete(key);
    for (const kv of res.kvs) this.setRecord(kv);
    this.relists++;
    const revision = BigInt(res.revision) + 1n;
    await this.watchFrom(revision);
    if (this.degraded) {
      this.degraded = false;
      this.log.info({ workers: this.set.size }, "etcd discovery restored");
      this.emit({ type: "restored" });
    }
  }

  private async watchFrom(revision: bigint): Promise<void> {
    const w = this.client.watch().prefix(this.keyPrefix).startRevision(revision.toString()).watcher();
    this.watcher = w;
    w.on("put", (kv) => this.setRecord(kv));
    w.on("delete", (kv) => this.removeKey(kv.key.toString()));
    const connected = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("watch not established in 5 s")), 5000);
      w.once("connected", () => {
        clearTimeout(timer);
        resolve();
      });
      w.once("disconnected", (err: Error) => {
        clearTimeout(timer);
        reject(err);
      });
      w.once("error", (err: Error) => {
        clearTimeout(timer);
        reject(err);
      });
    });
    try {
      await connected;
    } catch (err) {
      if (this.watcher === w) this.watcher = null;
      await w.cancel().catch(() => undefined);
      throw err;
    }
    // After the first connect, any loss goes through a full re-list (the set may have
    // changed beyond what the watch can replay, e.g. after compaction).
    w.on("disconnected", (err: Error) => this.onWatchLost(w, err));
    w.on("error", (err: Error) => this.onWatchLost(w, err));
  }

  private onWatchLost(w: Watcher, err: unknown): void {
    if (this.closed || this.watcher !== w) return;
    this.watcher = null;
    void w.cancel().catch(() => undefined);
    if (!this.degraded)
      this.enterDegraded(
        err,
        { workers: this.set.size },
        "etcd discovery degraded; serving the last known set",
      );
    void this.resync();
  }

  /** Marks the set degraded, logs why, and tells listeners (the `restored` event follows the next list). */
  private enterDegraded(err: unknown, context: Record<string, unknown>, msg: string): void {
    this.degraded = true;
    const reason = errText(err);
    this.log.warn({ reason, ...context }, msg);
    this.emit({ type: "degraded", reason });
  }

  private async resync(): Promise<void> {
    if (this.resyncing) return;
    this.resyncing = true;
    let delay = this.backoff.initialMs;
    try {
      while (!this.closed) {
        try {
          await this.listAndWatch();
          return;
        } catch (err) {
          this.log.debug({ err: errText(err), retryMs: delay }, "etcd re-list failed");
          await sleep(delay);
          delay = Math.min(delay * 2, this.backoff.maxMs);
        }
      }
    } finally {
      this.resyncing = false;
    }
  }
}

/**
 * The `etcd` line of the discovery factory: endpoints from `etcdEndpoints` (each may be a
 * comma list; default INFERA_ETCD or 127.0.0.1:2379), auth/TLS from `options`
 * (`username`, `password`, `caFile`, `certFile`, `keyFile`, `startTimeoutMs`, `startDegraded`).
 */
/** The etcd connection a server's discovery config names (also used by src/server/peer-plane.ts). */
export function etcdOptionsFromConfig(c: DiscoveryConfig): EtcdOptions {
  const o = c.options ?? {};
  const str = (k: string) => (typeof o[k] === "string" ? (o[k] as string) : undefined);
  const endpoints = parseEndpoints([...(c.etcdEndpoints ?? [])]);
  return {
    endpoints:
      endpoints.length > 0 ? endpoints : parseEndpoints(envVar("INFERA_ETCD") ?? "http://127.0.0.1:2379"),
    prefix: c.prefix,
    username: str("username"),
    password: str("password") ?? envVar("INFERA_ETCD_PASSWORD"),
    caFile: str("caFile"),
    certFile: str("certFile"),
    keyFile: str("keyFile"),
  };
}

export function createEtcdWatcherFromConfig(c: DiscoveryConfig, logger: Logger): EtcdWatcher {
  const o = c.options ?? {};
  return new EtcdWatcher({
    ...etcdOptionsFromConfig(c),
    startTimeoutMs: typeof o.startTimeoutMs === "number" ? o.startTimeoutMs : undefined,
    // A server starts degraded rather than exiting while etcd is down (config `startDegraded: false` to fail fast).
    startDegraded: o.startDegraded !== false,
    logger,
  });
}
