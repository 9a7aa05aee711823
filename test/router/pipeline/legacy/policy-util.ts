// FROZEN copy of the pre-pipeline implementation (commit a5c2372), kept to prove the presets exact. Do not edit.
/** Helpers shared by the kv-aware and approx-prefix policies. */
import type { WorkerState } from "../../../../src/router/types.ts";

/** A numeric policy option (flags arrive as numbers or numeric strings). */
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

/** Index of the least-loaded worker; ties → the larger `prefer` value, then the smaller worker id. */
export function leastLoaded(
  candidates: readonly WorkerState[],
  loads: ArrayLike<number>,
  prefer?: ArrayLike<number>,
): number {
  let best = 0;
  for (let i = 1; i < candidates.length; i++) {
    const d = loads[i] - loads[best];
    if (d < 0) best = i;
    else if (d === 0) {
      const p = prefer ? prefer[i] - prefer[best] : 0;
      if (p > 0 || (p === 0 && candidates[i].record.id < candidates[best].record.id)) best = i;
    }
  }
  return best;
}
