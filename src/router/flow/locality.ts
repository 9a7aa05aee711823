/**
 * Locality for flow control (issue #29; bench/fleet-routing/RESULTS.md Run I → Run J). A queued
 * request released to whichever worker has headroom at that moment leaves the worker holding its
 * prefix (a conversation's history) and pays a cold prefill there; at 2× capacity that extra
 * prefill is what the queue was there to save. So, before a request is released:
 *
 * - the policy's overlap source (`RoutingPolicy.cachedTokens`: the KV index, the pending bridge,
 *   peers' announcements — what the kv-prefix scorer reads) says how many prompt tokens each
 *   candidate holds;
 * - when a worker WITHOUT headroom holds at least `minGainTokens` more of the prompt than the
 *   best worker with headroom, the request is passed over (it keeps its place) for at most
 *   `waitMs`, counted from the first time it was passed over, not from its arrival (under
 *   saturation every request waits longer than that in the queue anyway); entries behind it
 *   (up to `lookahead` per dispatch) may take the free worker meanwhile, so a worker that frees
 *   goes to a request whose prefix it holds, or that has no better place;
 * - when released, it goes only to the workers with headroom holding within `minGainTokens` of
 *   the most any of them holds (the router's scheduler chooses among those).
 *
 * Past `waitMs` it escapes to any worker with headroom, and an entry past its band's `agingMs`
 * never waits for locality, so the band and starvation bounds hold; the order may deviate by at
 * most `waitMs` per entry. `waitMs: 0` turns it off.
 */
import type { WorkerState } from "../types.ts";

export interface LocalityConfig {
  /** Longest extra wait (ms) for the worker holding the prompt's prefix; 0 = off. */
  readonly waitMs: number;
  /** A worker must hold this many more prompt tokens than the best one with headroom to be waited for. */
  readonly minGainTokens: number;
  /** Entries one dispatch pass looks at (the look-ahead window). */
  readonly lookahead: number;
  /**
   * Which of the window's entries that need not wait goes: `first` in order, or `cheapest`, the
   * fewest prompt tokens not cached on the workers it may go to (the least prefill work added).
   */
  readonly pick: "first" | "cheapest";
}

/**
 * waitMs ≈ two prefills of a 3k-token prompt on an H100 pair (Qwen3-32B/TP2: ~0.25 s each), the
 * bench's 0.5 model s; `cheapest` and a longer wait served more within the SLO at 2× capacity
 * (bench/fleet-routing/RESULTS.md Run J: waits of 0.25, 0.5, 1 model s).
 */
export const DEFAULT_LOCALITY: LocalityConfig = {
  waitMs: 500,
  minGainTokens: 512,
  lookahead: 32,
  pick: "cheapest",
};

/** Per candidate (same positions), the prompt tokens cached there; null: unknown (no prefix policy). */
export type CachedTokensOf = (candidates: readonly WorkerState[]) => readonly number[] | null;

/** What the locality rule says for one request. */
export type LocalityVerdict =
  /**
   * Release to these workers (a subset of the ones with headroom); `local`: none holds notably
   * more; `cached`: the most prompt tokens one of them holds, null when unknown (off, or a
   * policy without a prefix scorer).
   */
  | { readonly fits: ReadonlySet<string>; readonly local: boolean; readonly cached: number | null }
  /** Wait for a worker without headroom that holds notably more of the prompt. */
  | null;

/**
 * The locality rule for one request whose headroom verdict is `fits` (non-empty). `expired`:
 * it has waited `waitMs` for locality already (or is past its band's aging): release anyway.
 */
export function localityVerdict(
  cfg: LocalityConfig,
  fits: ReadonlySet<string>,
  candidates: readonly WorkerState[],
  cached: readonly number[] | null,
  expired: boolean,
): LocalityVerdict {
  if (cfg.waitMs <= 0 || cached === null || cached.length !== candidates.length)
    return { fits, local: true, cached: null };
  let best = 0;
  let bestFit = 0;
  for (let i = 0; i < candidates.length; i++) {
    const c = cached[i] ?? 0;
    best = Math.max(best, c);
    if (fits.has(candidates[i].record.id)) bestFit = Math.max(bestFit, c);
  }
  const local = best - bestFit < cfg.minGainTokens;
  if (!local && !expired) return null;
  // Nothing worth keeping among the ones with headroom: the scheduler chooses freely.
  if (bestFit < cfg.minGainTokens) return { fits, local, cached: bestFit };
  const near = new Set<string>();
  for (let i = 0; i < candidates.length; i++) {
    const id = candidates[i].record.id;
    if (fits.has(id) && (cached[i] ?? 0) > bestFit - cfg.minGainTokens) near.add(id);
  }
  return { fits: near, local, cached: bestFit };
}
