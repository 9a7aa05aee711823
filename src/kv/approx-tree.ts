/**
 * An approximate prefix tree of what THIS server routed where (sgl-router's cache-aware
 * approach): the templated prompt text is cut into fixed-size character chunks, each chunk's
 * node is the chained hash of the chunks before it (a radix tree over chunks, stored flat), and
 * each node remembers which workers were sent a prompt through it. Per worker the nodes are kept
 * in LRU order and bounded, standing in for the engine's own eviction.
 *
 * Only the text's first `maxChars` characters are walked (issue #17 item 1): an insert is one
 * node per chunk, so a 64 k-character prompt cost ~1 k map and set updates (up to 12 ms on the
 * event loop) and filled the per-worker budget with one prompt's tail. Normal prompts are far
 * shorter than the cap and are unaffected; past it, every text matches as if it ended there.
 */

import { fmix32, rotl } from "./hash.ts";

export interface ApproxTreeOptions {
  /** Characters per chunk (the tree's granularity). Default 64. */
  chunkChars?: number;
  /** Nodes kept per worker before the least recently used are evicted. Default 100_000. */
  maxNodesPerWorker?: number;
  /** Nodes not touched for this long no longer match (0 = never expire). Default 0. */
  maxAgeMs?: number;
  /** Characters of a text the tree looks at (its head). Default `APPROX_TEXT_CAP`. */
  maxChars?: number;
  /** Clock (tests). */
  now?: () => number;
}

/** Default head of a text the tree walks: 32 Ki characters (512 chunks of 64). */
export const APPROX_TEXT_CAP = 32 * 1024;

/**
 * Head of a prompt the pending bridge keys by (kv-prefix `bridgePending`): 256 Ki characters
 * (≈ 50 k tokens of English), so a prompt at a 40 k `max_model_len` counts whole while it waits
 * for its prefill; with the 32 Ki head such a prompt counted as 16 % cached. The bridge only
 * counts nodes (no per-node LRU as in `insert`): a 208 Ki-character path and its `add` cost
 * ≈ 1.3 ms each on a loaded 2-core box (bench/tokenizer/bridge.ts); the whole 1 Mi routing head
 * cost 8 + 22 ms, so the bridge stops here.
 */
export const BRIDGE_TEXT_CAP = 256 * 1024;

const TWO20 = 1048576;

export class ApproxPrefixTree {
  readonly chunkChars: number;
  readonly maxNodesPerWorker: number;
  readonly maxAgeMs: number;
  readonly maxChars: number;
  private readonly now: () => number;
  /**
   * worker → its node keys with their last touch time, least recently used first (Map order).
   * It is the only index: a match asks each candidate's map for the node (a handful of
   * workers), so no node → holders sets are allocated per chunk.
   */
  private readonly perWorker = new Map<string, Map<number, number>>();

  constructor(opts: ApproxTreeOptions = {}) {
    this.chunkChars = opts.chunkChars ?? 64;
    this.maxNodesPerWorker = opts.maxNodesPerWorker ?? 100_000;
    this.maxAgeMs = opts.maxAgeMs ?? 0;
    this.maxChars = opts.maxChars ?? APPROX_TEXT_CAP;
    this.now = opts.now ?? Date.now;
  }

  /**
   * Node keys along the head of the text (`maxChars`): two chained 32-bit hashes (murmur3's
   * mixing, as `hashString` of each chunk) folded into one 52-bit number. The chunks are hashed
   * in place, in one pass for both lanes: no chunk strings are allocated.
   */
  path(whole: string): number[] {
    const len = Math.min(whole.length, this.maxChars);
    // One slice flattens a rope (a templated prompt is one) once; charCodeAt on the rope itself
    // takes the slow path per character (1.8 ms instead of 0.1 ms for 32 Ki characters).
    const text = whole.slice(0, len);
    const n = Math.ceil(len / this.chunkChars);
    const out = new Array<number>(n);
    let a = 0x1b873593;
    let b = 0x2f0e1eba;
    for (let i = 0; i < n; i++) {
      const from = i * this.chunkChars;
      const to = Math.min(len, from + this.chunkChars);
      let ha = a | 0;
      let hb = (b ^ 0x7fb5d329) | 0;
      for (let j = from; j < to; j++) {
        let k = Math.imul(text.charCodeAt(j), 0xcc9e2d51);
        k = Math.imul(rotl(k, 15), 0x1b873593);
        ha = (Math.imul(rotl(ha ^ k, 13), 5) + 0xe6546b64) | 0;
        hb = (Math.imul(rotl(hb ^ k, 13), 5) + 0xe6546b64) | 0;
      }
      a = fmix32(ha ^ (to - from));
      b = fmix32(hb ^ (to - from));
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
      mine.delete(k);
      mine.set(k, now);
    }
    while (mine.size > this.maxNodesPerWorker) {
      const oldest = mine.keys().next().value as number;
      mine.delete(oldest);
    }
  }

  /** Matched characters of `text` per worker (aligned with `workerIds`), and the text length. */
  match(text: string, workerIds: readonly string[]): Int32Array {
    const out = new Int32Array(workerIds.length);
    const path = this.path(text);
    const oldest = this.maxAgeMs > 0 ? this.now() - this.maxAgeMs : Number.NEGATIVE_INFINITY;
    let active = 0;
    const alive = new Uint8Array(workerIds.length);
    const maps: (Map<number, number> | undefined)[] = workerIds.map((id) => this.perWorker.get(id));
    for (let i = 0; i < workerIds.length; i++)
      if (maps[i]) {
        alive[i] = 1;
        active++;
      }
    for (let c = 0; c < path.length && active > 0; c++) {
      const matched = Math.min(text.length, this.maxChars, (c + 1) * this.chunkChars);
      for (let i = 0; i < workerIds.length; i++) {
        if (!alive[i]) continue;
        const touched = maps[i]!.get(path[c]);
        if (touched !== undefined && touched >= oldest) out[i] = matched;
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
    this.perWorker.delete(workerId);
  }
}
