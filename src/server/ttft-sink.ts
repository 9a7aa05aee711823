/**
 * Where the server's TTFT predictor (src/router/predict/ttft.ts) reports: the decision log
 * (`/debug/decisions` and the dashboard show each candidate's predicted TTFT and the winner's
 * observed one), the histogram `infera_ttft_prediction_relative_error` (|predicted − observed| /
 * observed, per model), and a ring of the last relative errors per model for the dashboard's
 * median and p90.
 */
import { Histogram, type Registry } from "prom-client";
import type { DecisionLog } from "../router/pipeline/decisions.ts";
import type { TtftSink } from "../router/predict/ttft.ts";

const RING = 512;

export interface PredictionErrorSummary {
  model: string;
  /** Observations with a prediction in the ring (at most 512). */
  samples: number;
  /** Median and p90 of |predicted − observed| / observed over them. */
  median: number;
  p90: number;
}

export class TtftReport implements TtftSink {
  private readonly hist: Histogram<"model">;
  private readonly decisions: DecisionLog | undefined;
  private readonly rings = new Map<string, { v: Float64Array; n: number; next: number }>();

  constructor(registry: Registry, decisions?: DecisionLog) {
    this.decisions = decisions;
    this.hist = new Histogram({
      name: "infera_ttft_prediction_relative_error",
      help: "|predicted - observed| / observed TTFT of routed streamed requests (the predicted-ttft predictor)",
      labelNames: ["model"],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5],
      registers: [registry],
    });
  }

  predicted(requestId: string, step: string, perCandidate: Float64Array): void {
    this.decisions?.notePredicted(requestId, step, perCandidate);
  }

  observed(model: string, requestId: string, step: string, predictedMs: number, observedMs: number): void {
    this.decisions?.noteObserved(requestId, step, observedMs);
    if (Number.isNaN(predictedMs) || !(observedMs > 0)) return;
    const rel = Math.abs(predictedMs - observedMs) / observedMs;
    this.hist.observe({ model }, rel);
    let r = this.rings.get(model);
    if (!r) {
      r = { v: new Float64Array(RING), n: 0, next: 0 };
      this.rings.set(model, r);
    }
    r.v[r.next] = rel;
    r.next = (r.next + 1) % RING;
    if (r.n < RING) r.n++;
  }

  /** Median and p90 relative error of the last observations, per model. */
  summary(): PredictionErrorSummary[] {
    const out: PredictionErrorSummary[] = [];
    for (const [model, r] of this.rings) {
      const v = Array.from(r.v.subarray(0, r.n)).sort((a, b) => a - b);
      const q = (p: number): number => v[Math.min(v.length - 1, Math.floor(p * v.length))] ?? Number.NaN;
      out.push({ model, samples: r.n, median: q(0.5), p90: q(0.9) });
    }
    return out;
  }
}
