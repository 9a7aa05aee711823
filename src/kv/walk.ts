/**
 * Matching a prompt against many workers in one walk of the fleet's BlockTable: the prompt is
 * hashed once per distinct block size, every candidate rank is marked, and BlockTable.walk moves
 * the marks of those that hold each next block. A worker's overlap is its best rank's depth.
 */
import type { BlockTable } from "./block-table.ts";
import { hashPrompt } from "./hash.ts";

/** What the walk needs of a tracked worker. */
export interface WalkWorker {
  blockSize: number;
  /** The worker's ranks (their holder ids) and, in the same order, their DP rank numbers. */
  rankList: readonly { readonly hid: number }[];
  rankIds: readonly number[];
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

  /** Overlaps of `ws` (undefined: not tracked, -1), best ranks into `bestRank` when given. */
  overlaps(
    table: BlockTable,
    tokens: ArrayLike<number>,
    ws: readonly (WalkWorker | undefined)[],
    cacheSalt?: string | null,
    loraName?: string | null,
    bestRank?: Int32Array,
  ): Int32Array {
    const n = ws.length;
    const out = new Int32Array(n);
    // The first tracked worker's block size is marked in the same pass that sorts out the rest
    // (one pass over 1,000 workers is a good part of a match's cost).
    let bs = 0;
    let base = 0;
    let others = false;
    const marks = this.marks;
    for (let i = 0; i < n; i++) {
      const w = ws[i];
      if (bestRank) bestRank[i] = -1;
      if (w === undefined) {
        out[i] = -1;
        continue;
      }
      if (bs === 0) {
        bs = w.blockSize;
        base = this.reserve(Math.floor(tokens.length / bs));
      } else if (w.blockSize !== bs) {
        others = true;
        continue;
      }
      const list = w.rankList;
      for (let j = 0; j < list.length; j++) marks[list[j].hid] = base;
    }
    if (bs === 0) return out;
    this.walkSize(table, tokens, bs, base, ws, out, cacheSalt, loraName, bestRank);
    if (!others) return out;
    const done = [bs];
    for (let i = 0; i < n; i++) {
      const w = ws[i];
      if (w === undefined || done.includes(w.blockSize)) continue;
      const size = w.blockSize;
      done.push(size);
      const b = this.reserve(Math.floor(tokens.length / size));
      for (let k = i; k < n; k++) {
        const v = ws[k];
        if (v === undefined || v.blockSize !== size) continue;
        for (let j = 0; j < v.rankList.length; j++) marks[v.rankList[j].hid] = b;
      }
      this.walkSize(table, tokens, size, b, ws, out, cacheSalt, loraName, bestRank);
    }
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
    ws: readonly (WalkWorker | undefined)[],
    out: Int32Array,
    cacheSalt: string | null | undefined,
    loraName: string | null | undefined,
    bestRank: Int32Array | undefined,
  ): void {
    const need = 2 * Math.floor(tokens.length / bs);
    if (this.scratch.length < need) this.scratch = new Uint32Array(need * 2);
    const chain = hashPrompt(tokens, bs, cacheSalt, this.scratch, loraName);
    const blocks = chain.length >>> 1;
    const marks = this.marks;
    if (blocks > 0) table.walk(chain, blocks, marks, base);
    for (let i = 0; i < ws.length; i++) {
      const w = ws[i];
      if (w === undefined || w.blockSize !== bs) continue;
      let best = 0;
      const list = w.rankList;
      for (let j = 0; j < list.length; j++) {
        const k = marks[list[j].hid] - base;
        if (k > best) {
          best = k;
          if (bestRank) bestRank[i] = w.rankIds[j];
        }
      }
      out[i] = best;
    }
  }
}
