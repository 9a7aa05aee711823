/**
 * An approximate prefix tree of what THIS server routed where (sgl-router's cache-aware
 * approach): the templated prompt text is cut into fixed-size character chunks, each chunk's
 * node is the chained hash of the chunks before it (a radix tree over chunks, stored flat), and
 * each node remembers which workers were sent a prompt through it. Per worker the nodes are kept
 * in LRU order and bounded, standing in for the engine's own eviction.
 */
import { hashString } from "./hash.ts";

export interface ApproxTreeOptions {
  /** Characters per chunk (the tree's granularity). Default 64. */
  chunkChars?: number;
  /** Nodes kept per worker before the least recently used are evicted. Default 100_000. */
  maxNodesPerWorker?: number;
  /** Nodes not touched for this long no longer match (0 = never expire). Default 0. */
  maxAgeMs?: number;
  /** Clock (tests). */
  now?: () => number;
}

const TWO20 = 1048576;

export class ApproxPrefixTree {
  readonly chunkChars: number;
  readonly maxNodesPerWorker: number;
  readonly maxAgeMs: number;
  private readonly now: () => number;
  /** node key → workers that hold it. */
  private readonly nodes = new Map<number, Set<string>>();
  /** worker → its node keys with their last touch time, least recently used first (Map order). */
  private readonly perWorker = new Map<string, Map<number, number>>();

  constructor(opts: ApproxTreeOptions = {}) {
    this.chunkChars = opts.chunkChars ?? 64;
    this.maxNodesPerWorker = opts.maxNodesPerWorker ?? 100_000;
    this.maxAgeMs = opts.maxAgeMs ?? 0;
    this.now = opts.now ?? Date.now;
  }

  /** Node keys along the text's path: two chained 32-bit hashes folded into one 52-bit number. */
  path(text: string): number[] {
    const n = Math.ceil(text.length / this.chunkChars);
    const out = new Array<number>(n);
    let a = 0x1b873593;
    let b = 0x2f0e1eba;
    for (let i = 0; i < n; i++) {
      const chunk = text.slice(i * this.chunkChars, (i + 1) * this.chunkChars);
      a = hashString(chunk, a);
      b = hashString(chunk, b ^ 0x7fb5d329);
      out[i] = a * TWO20 + (b >>> 12);
    }
    return out;
  }

  /** Records that `text` was sent to `workerId`. */
  insert(text: string, workerId: string): void {
    const path = this.path(text);
    let mine = this.perWorker.get(workerId);
    if (!mine) {
      mine = new Map();
      this.perWorker.set(workerId, mine);
    }
    // Touch leaf-first so the root ends up most recent: eviction then trims old branches' tails
    // before the prefixes they share.
    const now = this.now();
    for (let i = path.length - 1; i >= 0; i--) {
      const k = path[i];
      if (mine.has(k)) mine.delete(k);
      else {
        let holders = this.nodes.get(k);
        if (!holders) {
          holders = new Set();
          this.nodes.set(k, holders);
        }
        holders.add(workerId);
      }
      mine.set(k, now);
    }
    while (mine.size > this.maxNodesPerWorker) {
      const oldest = mine.keys().next().value as number;
      mine.delete(oldest);
      this.dropHolder(oldest, workerId);
    }
  }

  /** Matched characters of `text` per worker (aligned with `workerIds`), and the text length. */
  match(text: string, workerIds: readonly string[]): Int32Array {
    const out = new Int32Array(workerIds.length);
    const path = this.path(text);
    const oldest = this.maxAgeMs > 0 ? this.now() - this.maxAgeMs : Number.NEGATIVE_INFINITY;
    let active = 0;
    const alive = new Uint8Array(workerIds.length);
    for (let i = 0; i < workerIds.length; i++)
      if (this.perWorker.has(workerIds[i])) {
        alive[i] = 1;
        active++;
      }
    for (let c = 0; c < path.length && active > 0; c++) {
      const holders = this.nodes.get(path[c]);
      const matched = Math.min(text.length, (c + 1) * this.chunkChars);
      for (let i = 0; i < workerIds.length; i++) {
        if (!alive[i]) continue;
        if (holders?.has(workerIds[i]) && this.perWorker.get(workerIds[i])!.get(path[c])! >= oldest)
          out[i] = matched;
        else {
          alive[i] = 0;
          active--;
        }
      }
    }
    return out;
  }

  /** Nodes held for a worker (its approximate cache size). */
  size(workerId: string): number {
    return this.perWorker.get(workerId)?.size ?? 0;
  }

  removeWorker(workerId: string): void {
    const mine = this.perWorker.get(workerId);
    if (!mine) return;
    for (const k of mine.keys()) this.dropHolder(k, workerId);
    this.perWorker.delete(workerId);
  }

  private dropHolder(key: number, workerId: string): void {
    const holders = this.nodes.get(key);
    if (!holders) return;
    holders.delete(workerId);
    if (holders.size === 0) this.nodes.delete(key);
  }
}
