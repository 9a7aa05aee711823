/**
 * The dashboard's traffic view over the last minutes, built only from counters and histograms the
 * server already keeps (ServerMetrics' fast families). Nothing here runs on the request path: a
 * sample (a copy of the cumulative counts) is taken when a dashboard snapshot is asked for, at most
 * once per `minSampleMs`, and the rates and percentiles are the differences between samples.
 */
import type { ServerMetrics } from "../metrics.ts";
import type { Percentiles, TrafficPoint, TrafficView } from "./wire.ts";

/** Per-bucket counts (not cumulative) of one histogram, plus the total (the +Inf bucket included). */
interface HistCounts {
  buckets: readonly number[];
  counts: Float64Array;
  count: number;
}

interface ModelSample {
  requests: number;
  promptTokens: number;
  ttft: HistCounts | null;
  itl: HistCounts | null;
  e2e: HistCounts | null;
}

interface Sample {
  t: number;
  models: Map<string, ModelSample>;
  /** Cached prompt blocks on the chosen workers (the KV index's view), all models. */
  overlapBlocks: number;
}

export interface TrafficWindowOptions {
  /** How far back samples are kept (default 5 minutes). */
  keepMs?: number;
  /** Samples closer than this to the previous one are not taken (default 900 ms). */
  minSampleMs?: number;
  /** Each point covers this much time back (default 10 s), so a quiet second is not a gap. */
  spanMs?: number;
}

export class TrafficWindow {
  private readonly metrics: ServerMetrics;
  /** Reads the cumulative overlap-blocks counter (null when the server keeps none). */
  private readonly overlapBlocks: () => Promise<number | null>;
  private readonly samples: Sample[] = [];
  private readonly keepMs: number;
  private readonly minSampleMs: number;
  private readonly spanMs: number;

  constructor(
    metrics: ServerMetrics,
    overlapBlocks: () => Promise<number | null>,
    opts: TrafficWindowOptions = {},
  ) {
    this.metrics = metrics;
    this.overlapBlocks = overlapBlocks;
    this.keepMs = opts.keepMs ?? 5 * 60_000;
    this.minSampleMs = opts.minSampleMs ?? 900;
    this.spanMs = opts.spanMs ?? 10_000;
  }

  /** Takes a sample unless the last one is recent. */
  async sample(now = Date.now()): Promise<void> {
    const last = this.samples[this.samples.length - 1];
    if (last && now - last.t < this.minSampleMs) return;
    const s: Sample = { t: now, models: new Map(), overlapBlocks: (await this.overlapBlocks()) ?? 0 };
    const m = (name: string): ModelSample => {
      let x = s.models.get(name);
      if (!x) {
        x = { requests: 0, promptTokens: 0, ttft: null, itl: null, e2e: null };
        s.models.set(name, x);
      }
      return x;
    };
    this.metrics.requests.forEach((v, c) => {
      m(v[0]!).requests += c.value;
    });
    this.metrics.promptTokens.forEach((v, c) => {
      m(v[0]!).promptTokens += c.value;
    });
    this.metrics.ttft.forEach((v, h) => {
      m(v[0]!).ttft = addHist(m(v[0]!).ttft, h.read());
    });
    this.metrics.itl.forEach((v, h) => {
      m(v[0]!).itl = addHist(m(v[0]!).itl, h.read());
    });
    // e2e is per (model, endpoint): summed per model.
    this.metrics.e2e.forEach((v, h) => {
      m(v[0]!).e2e = addHist(m(v[0]!).e2e, h.read());
    });
    this.samples.push(s);
    while (this.samples.length > 2 && now - this.samples[0]!.t > this.keepMs) this.samples.shift();
  }

  /** The model's series: one point per sample after the first, each over the last `spanMs`. */
  view(model: string, blockSize: number): TrafficView {
    const series: TrafficPoint[] = [];
    let from = 0;
    for (let i = 1; i < this.samples.length; i++) {
      const cur = this.samples[i]!;
      while (from < i - 1 && cur.t - this.samples[from + 1]!.t >= this.spanMs) from++;
      const prev = this.samples[from]!;
      const a = prev.models.get(model);
      const b = cur.models.get(model);
      const secs = Math.max(0.001, (cur.t - prev.t) / 1000);
      const prompt = (b?.promptTokens ?? 0) - (a?.promptTokens ?? 0);
      const cached = (cur.overlapBlocks - prev.overlapBlocks) * blockSize;
      series.push({
        t: cur.t,
        rps: ((b?.requests ?? 0) - (a?.requests ?? 0)) / secs,
        ttft: percentiles(diffHist(b?.ttft ?? null, a?.ttft ?? null)),
        itl: percentiles(diffHist(b?.itl ?? null, a?.itl ?? null)),
        e2e: percentiles(diffHist(b?.e2e ?? null, a?.e2e ?? null)),
        cacheHitRate: prompt > 0 ? Math.min(1, Math.max(0, cached / prompt)) : null,
      });
    }
    return { windowSeconds: this.spanMs / 1000, series, totals: this.totals(model) };
  }

  /** The model's counters now (not the last sample's: samples are at most one per `minSampleMs`). */
  private totals(model: string): TrafficView["totals"] {
    let requests = 0;
    let promptTokens = 0;
    this.metrics.requests.forEach((v, c) => {
      if (v[0] === model) requests += c.value;
    });
    this.metrics.promptTokens.forEach((v, c) => {
      if (v[0] === model) promptTokens += c.value;
    });
    return { requests, promptTokens };
  }
}

function addHist(acc: HistCounts | null, h: HistCounts): HistCounts {
  if (!acc) return h;
  const counts = acc.counts.slice();
  for (let i = 0; i < counts.length; i++) counts[i] += h.counts[i] ?? 0;
  return { buckets: acc.buckets, counts, count: acc.count + h.count };
}

function diffHist(b: HistCounts | null, a: HistCounts | null): HistCounts | null {
  if (!b) return null;
  if (!a) return b;
  const counts = b.counts.slice();
  for (let i = 0; i < counts.length; i++) counts[i] -= a.counts[i] ?? 0;
  return { buckets: b.buckets, counts, count: b.count - a.count };
}

/**
 * Quantiles from bucket counts, interpolated linearly inside the bucket (as Prometheus'
 * histogram_quantile does); a quantile in the +Inf bucket is reported as the last bound.
 */
export function quantile(h: HistCounts, q: number): number | null {
  if (h.count <= 0) return null;
  const rank = q * h.count;
  let cum = 0;
  for (let i = 0; i < h.buckets.length; i++) {
    const c = h.counts[i]!;
    if (cum + c >= rank && c > 0) {
      const lo = i === 0 ? 0 : h.buckets[i - 1]!;
      const hi = h.buckets[i]!;
      return lo + (hi - lo) * ((rank - cum) / c);
    }
    cum += c;
  }
  return h.buckets[h.buckets.length - 1] ?? null;
}

function percentiles(h: HistCounts | null): Percentiles {
  if (!h || h.count <= 0) return { p50: null, p90: null, p99: null };
  return { p50: quantile(h, 0.5), p90: quantile(h, 0.9), p99: quantile(h, 0.99) };
}
