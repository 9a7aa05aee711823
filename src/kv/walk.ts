/**
 * Matching a prompt against many workers in one walk of the fleet's BlockTable: the prompt is
 * hashed once per distinct block size, every candidate rank is marked, and BlockTable.walk moves
 * the marks of those that hold each next block. A worker's overlap is its best rank's depth.
 */
import type { BlockTable } from "./block-table.ts";
import { hashBlockInto, rootSeedInto } from "./hash.ts";

/**
 * Blocks hashed before each stretch of the walk: the walk usually stops well before a long
 * prompt's end (nobody holds the rest), and the blocks past the stop are then never hashed.
 */
const HASH_STRETCH = 32;

/** What the walk needs of a tracked worker. */
export interface WalkWorker {
  blockSize: number;
  /** The worker's ranks (their holder ids) and, in the same order, their DP rank numbers. */
  rankList: readonly { readonly hid: number }[];
  rankIds: readonly number[];
}

/**
 * A candidate list flattened into typed arrays: marking 1,000 candidates and reading their
 * depths back then runs over two flat arrays instead of 1,000 objects and their rank lists.
 * Built once per candidate list (`plan`) and reused while the list, the workers, their ranks
 * and their block sizes stay the same (the index rebuilds it when any of these changes).
 */
export interface WalkPlan {
  readonly n: number;
  /** Holder ids of the candidates' ranks, worker by worker. */
  readonly hids: Uint32Array;
  /** DP rank numbers, parallel to `hids`. */
  readonly ranks: Int32Array;
  /** Candidate i's ranks are `hids[starts[i]]` up to (not including) `hids[starts[i + 1]]`. */
  readonly starts: Uint32Array;
  /** Candidate i's block size; -1 for a worker the index does not track. */
  readonly sizes: Int32Array;
  /** The block sizes present, first-seen order. */
  readonly distinct: readonly number[];
}

/** Flattens `ws` (undefined: a worker the index does not track) into a WalkPlan. */
export function plan(ws: readonly (WalkWorker | undefined)[]): WalkPlan {
  const n = ws.length;
  let total = 0;
  for (const w of ws) if (w) total += w.rankList.length;
  const hids = new Uint32Array(total);
  const ranks = new Int32Array(total);
  const starts = new Uint32Array(n + 1);
  const sizes = new Int32Array(n).fill(-1);
  const distinct: number[] = [];
  let at = 0;
  for (let i = 0; i < n; i++) {
    starts[i] = at;
    const w = ws[i];
    if (!w) continue;
    sizes[i] = w.blockSize;
    if (!distinct.includes(w.blockSize)) distinct.push(w.blockSize);
    for (let j = 0; j < w.rankList.length; j++) {
      hids[at] = w.rankList[j].hid;
      ranks[at] = w.rankIds[j];
      at++;
    }
  }
  starts[n] = at;
  return { n, hids, ranks, starts, sizes, distinct };
}

export class FleetWalk {
  /** Per holder id: the walk's mark (see BlockTable.walk). */
  private marks = new Uint32Array(64);
  /** The next unused mark base: every mark left by earlier walks is below it. */
  private base = 1;
  private scratch = new Uint32Array(2048);

  /** Makes room for holder id `hid` and forgets what a former holder of it left. */
  holder(hid: number): void {
    if (hid >= this.marks.length) {
      let n = this.marks.length * 2;
      while (n <= hid) n *= 2;
      const grown = new Uint32Array(n);
      grown.set(this.marks);
      this.marks = grown;
    }
    this.marks[hid] = 0;
  }

  bytes(): number {
    return this.marks.byteLength + this.scratch.byteLength;
  }

  /** Overlaps of the plan's candidates (not tracked: -1) into `into` (else a new row), best ranks into `bestRank` when given. */
  overlaps(
    table: BlockTable,
    tokens: ArrayLike<number>,
    p: WalkPlan,
    cacheSalt?: string | null,
    loraName?: string | null,
    bestRank?: Int32Array,
    into?: Int32Array,
  ): Int32Array {
    // Every entry is written below (a walked size's depth, or −1 untracked).
    const out = into ?? new Int32Array(p.n);
    if (bestRank) bestRank.fill(-1, 0, p.n);
    const { hids, starts, sizes } = p;
    const marks = this.marks;
    for (let d = 0; d < p.distinct.length; d++) {
      const bs = p.distinct[d];
      const base = this.reserve(Math.floor(tokens.length / bs));
      if (p.distinct.length === 1) {
        for (let j = 0; j < hids.length; j++) marks[hids[j]] = base;
      } else {
        for (let i = 0; i < p.n; i++) {
          if (sizes[i] !== bs) continue;
          for (let j = starts[i]; j < starts[i + 1]; j++) marks[hids[j]] = base;
        }
      }
      this.walkSize(table, tokens, bs, base, p, out, cacheSalt, loraName, bestRank);
    }
    for (let i = 0; i < p.n; i++) if (sizes[i] < 0) out[i] = -1;
    return out;
  }

  /** A mark base for a walk of `blocks` blocks, above every mark earlier walks left. */
  private reserve(blocks: number): number {
    if (this.base + blocks + 2 >= 0xffffffff) {
      this.marks.fill(0);
      this.base = 1;
    }
    const base = this.base;
    this.base += blocks + 2;
    return base;
  }

  /** Hashes and walks the prompt at block size `bs` (candidates marked with `base`), then reads the depths. */
  private walkSize(
    table: BlockTable,
    tokens: ArrayLike<number>,
    bs: number,
    base: number,
    p: WalkPlan,
    out: Int32Array,
    cacheSalt: string | null | undefined,
    loraName: string | null | undefined,
    bestRank: Int32Array | undefined,
  ): void {
    const blocks = Math.floor(tokens.length / bs);
    if (this.scratch.length < 2 * blocks) this.scratch = new Uint32Array(4 * blocks);
    const chain = this.scratch;
    const marks = this.marks;
    // Hash a stretch, walk it, and go on only while the walk does (./hash.ts hashPrompt, piece
    // by piece: the same chain).
    rootSeedInto(chain, cacheSalt, loraName);
    let lo = chain[0];
    let hi = chain[1];
    for (let from = 0; from < blocks; ) {
      const to = Math.min(blocks, from + HASH_STRETCH);
      for (let b = from; b < to; b++) {
        hashBlockInto(lo, hi, tokens, b * bs, (b + 1) * bs, chain, 2 * b);
        lo = chain[2 * b];
        hi = chain[2 * b + 1];
      }
      if (table.walk(chain, to, marks, base, from) < to) break;
      from = to;
    }
    const { hids, ranks, starts, sizes } = p;
    for (let i = 0; i < p.n; i++) {
      if (sizes[i] !== bs) continue;
      let best = 0;
      const end = starts[i + 1];
      for (let j = starts[i]; j < end; j++) {
        const k = marks[hids[j]] - base;
        if (k > best) {
          best = k;
          if (bestRank) bestRank[i] = ranks[j];
        }
      }
      out[i] = best;
    }
  }
}
