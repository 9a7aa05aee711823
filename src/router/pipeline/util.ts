/**
 * Helpers shared by the pipeline's plugins (moved out of src/kv: they are routing rules, not
 * KV-index code).
 */
import { isStable, markStable } from "../../util/stable-lists.ts";
import type { WorkerState } from "../types.ts";

/** A numeric option (flags arrive as numbers or numeric strings). */
export function numOption(opts: Readonly<Record<string, unknown>>, name: string, def: number): number {
  const v = opts[name];
  const n = typeof v === "number" ? v : typeof v === "string" && v.trim() !== "" ? Number(v) : Number.NaN;
  return Number.isFinite(n) ? n : def;
}

/** A worker's request load as the server sees it: its own in-flight count, or the engine's queue. */
export function requestLoad(w: WorkerState): number {
  const e = w.engineLoad;
  return e ? Math.max(w.inFlight, e.running + e.waiting) : w.inFlight;
}

/**
 * SGLang's imbalance rule: the fleet is imbalanced when max − min load exceeds an absolute
 * threshold AND max exceeds min × a ratio. Then load wins over cache locality.
 */
export function isImbalanced(loads: ArrayLike<number>, absThreshold: number, relThreshold: number): boolean {
  if (loads.length < 2) return false;
  let min = Number.POSITIVE_INFINITY;
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < loads.length; i++) {
    if (loads[i] < min) min = loads[i];
    if (loads[i] > max) max = loads[i];
  }
  return max - min > absThreshold && max > min * relThreshold;
}

/**
 * Index (into `ids`) of the least-loaded entry; ties → the larger `prefer` value, then the
 * smaller id.
 */
export function leastLoadedIndex(
  ids: readonly string[],
  loads: ArrayLike<number>,
  prefer?: ArrayLike<number>,
): number {
  let best = 0;
  for (let i = 1; i < ids.length; i++) {
    const d = loads[i] - loads[best];
    if (d < 0) best = i;
    else if (d === 0) {
      const p = prefer ? prefer[i] - prefer[best] : 0;
      if (p > 0 || (p === 0 && ids[i] < ids[best])) best = i;
    }
  }
  return best;
}

/** The decode-side load key: in-flight here, then the engine's running + waiting, then KV usage. */
export function decodeLoadKey(w: WorkerState): [number, number, number] {
  const l = w.engineLoad;
  return [w.inFlight, l ? l.running + l.waiting : 0, l ? l.kvUsage : 0];
}

/** The first worker with the smallest decodeLoadKey (list order breaks ties). */
export function leastLoadedWorker(ws: readonly WorkerState[]): WorkerState | null {
  let best: WorkerState | null = null;
  let bestKey: [number, number, number] | null = null;
  for (const w of ws) {
    const k = decodeLoadKey(w);
    if (
      !bestKey ||
      k[0] < bestKey[0] ||
      (k[0] === bestKey[0] && (k[1] < bestKey[1] || (k[1] === bestKey[1] && k[2] < bestKey[2])))
    ) {
      best = w;
      bestKey = k;
    }
  }
  return best;
}

/** A candidate list's worker ids and each id's position (see `candidateView`). */
export interface CandidateView {
  readonly ids: readonly string[];
  readonly pos: ReadonlyMap<string, number>;
}

/** `pos` is built on first use: a list made for one request (a retry, flow control's subset) may never need it. */
class View implements CandidateView {
  readonly ids: readonly string[];
  private p: Map<string, number> | null = null;

  constructor(ids: readonly string[]) {
    this.ids = ids;
  }

  get pos(): ReadonlyMap<string, number> {
    if (!this.p) {
      const p = new Map<string, number>();
      for (let i = 0; i < this.ids.length; i++) if (!p.has(this.ids[i])) p.set(this.ids[i], i);
      this.p = p;
    }
    return this.p;
  }
}

const views = new WeakMap<readonly WorkerState[], CandidateView>();

/**
 * The ids of `all` and a position per id, built once per candidate list: the WorkerSet hands
 * out the same arrays until its membership changes, so a decision over 256 workers reads them
 * instead of building a 256-id array (and a lookup map) per request. A list marked stable
 * (src/util/stable-lists.ts: the WorkerSet's) never changes, so its view is taken as it is; any
 * other is checked against the list each time (its length and every id), so a list changed in
 * place is seen and rebuilt. The ids are marked stable too: the KV index may then know them by
 * identity (KvIndex.workersFor).
 */
export function candidateView(all: readonly WorkerState[]): CandidateView {
  const v = views.get(all);
  if (v && isStable(all)) return v;
  if (v && v.ids.length === all.length) {
    let same = true;
    for (let i = 0; same && i < all.length; i++) same = all[i].record.id === v.ids[i];
    if (same) return v;
  }
  const ids = new Array<string>(all.length);
  for (let i = 0; i < all.length; i++) ids[i] = all[i].record.id;
  const nv = new View(markStable(ids));
  views.set(all, nv);
  return nv;
}
