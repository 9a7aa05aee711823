// The JSON of GET /dashboard/state as the page reads it (src/server/dashboard/state.ts makes it;
// the page is bundled separately, for the browser, so it declares the shape it relies on).
export interface Percentiles {
  p50: number | null;
  p90: number | null;
  p99: number | null;
}
export interface TrafficPoint {
  t: number;
  rps: number;
  ttft: Percentiles;
  itl: Percentiles;
  e2e: Percentiles;
  cacheHitRate: number | null;
}
export interface Worker {
  id: string;
  url: string;
  role: string;
  engine: string;
  connector: string;
  state: string;
  inFlight: number;
  routed: number;
  running: number | null;
  waiting: number | null;
  kvUsage: number | null;
  indexBlocks: number | null;
}
export interface ModelView {
  name: string;
  router: string | null;
  workers: Worker[];
  pd: {
    pairs: Array<{ prefill: string; decode: string; count: number }>;
    transfers: Array<{ requestId: string; prefill: string; decode: string; at: number }>;
  };
  traffic: {
    windowSeconds: number;
    series: TrafficPoint[];
    totals: { requests: number; promptTokens: number };
  };
}
export interface Candidate {
  worker: string;
  filtered?: boolean;
  scores: Record<string, number>;
  total: number | null;
  /** The prompt's leading blocks this worker caches; null when the profile has no overlap source. */
  cachedBlocks?: number | null;
  /** The prompt's full blocks at this worker's block size; null likewise. */
  promptBlocks?: number | null;
}
export interface Decision {
  requestId: string;
  model: string;
  step: string;
  at: number;
  candidates: Candidate[];
  winner: string;
  reason: string;
}
export interface Snapshot {
  object: string;
  at: number;
  server: { policy: string; draining: boolean; decisionCapacity: number };
  models: ModelView[];
  decisions: Decision[];
}
