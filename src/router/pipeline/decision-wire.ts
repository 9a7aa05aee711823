/**
 * A routing decision explained, as the decision ring keeps it and as its JSON goes out (GET
 * /debug/decisions, the dashboard's /dashboard/state). Types only and no imports, node or
 * otherwise: the dashboard page (web/dashboard, DOM lib, no node types) imports it as well.
 */

export type Step = "mixed" | "prefill" | "decode";

/**
 * One candidate of a decision. `Total` is `number` in memory and `number | null` in JSON: a
 * filtered candidate's total is NaN, which JSON.stringify writes as null.
 */
export interface CandidateExplanation<Total = number> {
  worker: string;
  /** Removed by a filter before scoring (its scores are absent). */
  filtered?: boolean;
  scores: Record<string, number>;
  total: Total;
  /**
   * Leading blocks of the prompt this candidate's cache holds, as the step's overlap source
   * counted them (KV index; approximate tree for workers without events); null when the
   * profile has no overlap source.
   */
  cachedBlocks: number | null;
  /** The prompt's full blocks at this candidate's block size; null with no overlap source. */
  promptBlocks: number | null;
  /**
   * Whether the KV index's view of this worker was in sync when the decision was made
   * (src/kv/prefix-index.ts IndexSync): `syncing` or `unknown` mean `cachedBlocks` came from the
   * fallback (what this server routed there), not the engine's events; null when the index does
   * not track the worker. Absent when the profile has no overlap source or no index.
   */
  indexSync?: "syncing" | "synced" | "unknown" | null;
  /**
   * Of `cachedBlocks`, the blocks credited by the pending bridge beyond what the index holds
   * (prompts routed there whose blocks the engine's events have not confirmed yet); null when
   * the profile has no bridge.
   */
  bridgeBlocks: number | null;
  /**
   * The TTFT (ms) the server's predictor gave this candidate (src/router/predict): present when a
   * profile's `predicted-ttft` / `ttft-saturation` followed the request; null when the predictor
   * knew nothing of the worker yet.
   */
  predictedTtftMs?: number | null;
}

/** One decision, explained: per candidate, each scorer's weighted value and the total. */
export interface DecisionExplanation<Total = number> {
  requestId: string;
  model: string;
  step: Step;
  /** Epoch milliseconds. */
  at: number;
  candidates: Array<CandidateExplanation<Total>>;
  winner: string;
  reason: string;
  /**
   * The TTFT observed on the winner (ms, routing to the first byte of the streamed answer),
   * beside its `predictedTtftMs`; null until it came (or when it never does: the request failed
   * or was cancelled first). Present when predictions were recorded.
   */
  observedTtftMs?: number | null;
}

/** A decision as its JSON reads (what the dashboard page and API clients get). */
export type DecisionExplanationJson = DecisionExplanation<number | null>;
