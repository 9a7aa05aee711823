/**
 * One feed per worker that a DiscoveryWatcher lists, kept in step with the registry: what both
 * KV ingests (./ingest.ts, for ZMQ and NATS feeds alike) share. A put opens a
 * feed (or reopens it when its key changed), a delete or a worker missing after "restored" closes
 * it, and every removal also drops the worker from the index so stale entries never outlive it.
 * What a feed is and how it is opened stays with the caller.
 */
import type { DiscoveryEvent, DiscoveryWatcher, KvEventsRank, WorkerRecord } from "../../discovery/types.ts";

/** Every rank's sockets: `kvEvents.ranks`, or the single endpoint as rank 0 (or the record's dpRank). */
export function rankSockets(rec: WorkerRecord): KvEventsRank[] {
  const e = rec.kvEvents;
  if (!e) return [];
  if (e.ranks && e.ranks.length > 0) return e.ranks;
  return [{ dpRank: rec.dpRank ?? 0, endpoint: e.endpoint, replayEndpoint: e.replayEndpoint }];
}

export interface WorkerFeedsOptions<S> {
  watcher: DiscoveryWatcher;
  /** Only workers of this model (any model when absent). */
  model?: string;
  /** What identifies the worker's feed; a changed key reopens it. null: the worker has no feed. */
  keyOf(rec: WorkerRecord): string | null;
  /** Opens (and starts) the worker's feed. */
  open(rec: WorkerRecord): S;
  close(feed: S): void | Promise<void>;
  /** Called for every worker removed (even one without a feed), to drop its index entries. */
  removeWorker(workerId: string): void;
  /** Told the number of open feeds whenever it changes (the ingest's `workers` gauge). */
  count(n: number): void;
}

export class WorkerFeeds<S> {
  private readonly opts: WorkerFeedsOptions<S>;
  private readonly feeds = new Map<string, { key: string; feed: S }>();
  private unsubscribe: (() => void) | null = null;

  constructor(opts: WorkerFeedsOptions<S>) {
    this.opts = opts;
  }

  /** Opens a feed for every current worker and follows changes. The watcher must be started. */
  start(): void {
    if (this.unsubscribe) return;
    this.unsubscribe = this.opts.watcher.onChange((ev) => this.onChange(ev));
    this.reconcile();
  }

  get(workerId: string): S | undefined {
    return this.feeds.get(workerId)?.feed;
  }

  has(workerId: string): boolean {
    return this.feeds.has(workerId);
  }

  /** [workerId, feed] for every open feed. */
  entries(): [string, S][] {
    return [...this.feeds].map(([id, f]) => [id, f.feed]);
  }

  all(): S[] {
    return [...this.feeds.values()].map((f) => f.feed);
  }

  /** Stops following the watcher and closes every feed. */
  async close(): Promise<void> {
    this.unsubscribe?.();
    this.unsubscribe = null;
    const all = this.all();
    this.feeds.clear();
    const closing = all.map((feed) => this.opts.close(feed));
    // Synchronous closers finish here without a tick, as they did before this was shared.
    if (closing.some((c) => c instanceof Promise)) await Promise.all(closing);
    this.opts.count(0);
  }

  private onChange(ev: DiscoveryEvent): void {
    if (ev.type === "put") this.upsert(ev.worker);
    else if (ev.type === "delete") this.drop(ev.id);
    else if (ev.type === "restored") this.reconcile();
  }

  private reconcile(): void {
    const live = new Set<string>();
    for (const rec of this.opts.watcher.workers()) {
      live.add(rec.id);
      this.upsert(rec);
    }
    for (const id of [...this.feeds.keys()]) if (!live.has(id)) this.drop(id);
  }

  private upsert(rec: WorkerRecord): void {
    if (this.opts.model && rec.model !== this.opts.model) return;
    const key = this.opts.keyOf(rec);
    const cur = this.feeds.get(rec.id);
    if (cur && cur.key === key) return;
    if (cur) this.drop(rec.id);
    if (key === null) return;
    const feed = this.opts.open(rec);
    this.feeds.set(rec.id, { key, feed });
    this.opts.count(this.feeds.size);
  }

  private drop(id: string): void {
    const cur = this.feeds.get(id);
    this.opts.removeWorker(id);
    if (!cur) return;
    this.feeds.delete(id);
    this.opts.count(this.feeds.size);
    void this.opts.close(cur.feed);
  }
}
