/**
 * Peers' announcements of one model, per worker, for their TTL.
 *
 * An announcement carries a digest of the prompt's approximate-tree path
 * (src/kv/approx-tree.ts `path`): each node hashes its 64-char chunk chained with every chunk
 * before it, so a node at position i stands for the whole prefix 0..i. `digest` keeps the first
 * nodes densely and then evenly spaced ones up to the last, and `match` answers "one past the
 * furthest position of the prompt's path that an announcement holds": the prefix coverage, to
 * within the spacing, from a bounded number of nodes whatever the prompt's length.
 *
 * Bounded: entries per worker (the oldest leaves first) and in all (a new one is then refused).
 * Entries leave when their TTL is over, checked in arrival order, or when their sender retracts
 * them (its own bridge entry ended: `retract`).
 */

interface Entry {
  expiresAt: number;
  nodes: Float64Array;
}

interface WorkerEntries {
  /** Arrival order. */
  entries: Entry[];
  /** Node → number of live entries holding it. */
  nodes: Map<number, number>;
}

export interface PeerTableOptions {
  maxEntriesPerWorker: number;
  maxEntries: number;
  /**
   * Leading nodes every digest carries whole (`digestDense` of the replicas' cap): a miss among
   * them ends a match at once (no entry can share more), so a worker no announcement matches
   * costs one lookup. Default: none assumed (the whole path is scanned).
   */
  denseNodes?: number;
  now?: () => number;
}

/** Leading nodes a digest of at most `cap` nodes keeps whole. */
export function digestDense(cap: number): number {
  return Math.max(1, Math.floor(cap / 2));
}

/** The nodes an announcement carries for `path`: all when ≤ `cap`, else a prefix-preserving sample. */
export function digest(path: readonly number[], cap: number): Float64Array {
  const n = path.length;
  if (n <= cap) return Float64Array.from(path);
  const out = new Float64Array(cap);
  const dense = digestDense(cap);
  for (let i = 0; i < dense; i++) out[i] = path[i];
  // The rest evenly from `dense` to the last node, the last one included.
  const rest = cap - dense;
  for (let j = 0; j < rest; j++) {
    const pos = rest === 1 ? n - 1 : dense + Math.round((j * (n - 1 - dense)) / (rest - 1));
    out[dense + j] = path[pos];
  }
  return out;
}

export class PeerTable {
  private readonly workers = new Map<string, WorkerEntries>();
  private total = 0;
  private readonly o: PeerTableOptions;
  private readonly now: () => number;

  constructor(o: PeerTableOptions) {
    this.o = o;
    this.now = o.now ?? Date.now;
  }

  /**
   * Records an announcement for `workerId` until `expiresAt`. Returns how many entries were
   * pushed out or refused for room (0 when it fit).
   */
  add(workerId: string, nodes: Float64Array, expiresAt: number): number {
    let w = this.workers.get(workerId);
    if (w) this.expire(w);
    if (!w) {
      if (this.total >= this.o.maxEntries) this.expireAll();
      if (this.total >= this.o.maxEntries) return 1;
      w = { entries: [], nodes: new Map() };
      this.workers.set(workerId, w);
    }
    let dropped = 0;
    if (w.entries.length >= this.o.maxEntriesPerWorker) {
      this.removeFirst(w, 1);
      dropped++;
    } else if (this.total >= this.o.maxEntries) {
      this.expireAll();
      if (this.total >= this.o.maxEntries) return 1;
    }
    w.entries.push({ expiresAt, nodes });
    this.total++;
    for (const k of nodes) w.nodes.set(k, (w.nodes.get(k) ?? 0) + 1);
    return dropped;
  }

  /**
   * Takes out the oldest live entry on `workerId` with exactly these nodes (the sender's
   * retraction of its announcement). Returns whether one was found.
   */
  retract(workerId: string, nodes: Float64Array): boolean {
    const w = this.workers.get(workerId);
    if (!w) return false;
    const n = nodes.length;
    if (n === 0) return false;
    const i = w.entries.findIndex(
      (e) => e.nodes.length === n && e.nodes[n - 1] === nodes[n - 1] && e.nodes[0] === nodes[0],
    );
    if (i < 0) return false;
    const [e] = w.entries.splice(i, 1);
    this.unholdNodes(w, e);
    this.total--;
    if (w.entries.length === 0) this.workers.delete(workerId);
    return true;
  }

  /** One past the furthest position of `path` that a live entry on `workerId` holds (0: none). */
  match(workerId: string, path: readonly number[]): number {
    const w = this.workers.get(workerId);
    if (!w) return 0;
    this.expire(w);
    if (w.nodes.size === 0) return 0;
    const dense = this.o.denseNodes ?? 0;
    let last = -1;
    for (let i = 0; i < path.length; i++) {
      if (w.nodes.has(path[i])) last = i;
      // Every entry sharing more than i nodes would hold node i (a dense position).
      else if (i < dense) return i;
    }
    return last + 1;
  }

  /** Live entries for a worker (tests, metrics). */
  size(workerId?: string): number {
    if (workerId === undefined) return this.total;
    return this.workers.get(workerId)?.entries.length ?? 0;
  }

  removeWorker(workerId: string): void {
    const w = this.workers.get(workerId);
    if (!w) return;
    this.total -= w.entries.length;
    this.workers.delete(workerId);
  }

  private expire(w: WorkerEntries): void {
    const now = this.now();
    let n = 0;
    while (n < w.entries.length && w.entries[n].expiresAt <= now) n++;
    if (n > 0) this.removeFirst(w, n);
  }

  private expireAll(): void {
    for (const [id, w] of this.workers) {
      this.expire(w);
      if (w.entries.length === 0) this.workers.delete(id);
    }
  }

  private removeFirst(w: WorkerEntries, n: number): void {
    for (let i = 0; i < n; i++) this.unholdNodes(w, w.entries[i]);
    w.entries.splice(0, n);
    this.total -= n;
  }

  /** Drops `e`'s hold on its nodes (a node no live entry holds leaves the map). */
  private unholdNodes(w: WorkerEntries, e: Entry): void {
    for (const k of e.nodes) {
      const c = w.nodes.get(k)! - 1;
      if (c === 0) w.nodes.delete(k);
      else w.nodes.set(k, c);
    }
  }
}
