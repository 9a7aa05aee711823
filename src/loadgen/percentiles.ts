/**
 * Percentiles by linear interpolation between closest ranks: the method of numpy's default
 * (`method="linear"`) and R's type 7. For sorted values x[0..n-1] and p in [0, 100], the rank is
 * h = (n - 1) * p / 100 and the result x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]).
 * So p0 is the minimum, p100 the maximum, p50 of an even count the mean of the middle two.
 */
export function percentile(sorted: readonly number[], p: number): number | null {
  const n = sorted.length;
  if (n === 0) return null;
  const h = ((n - 1) * Math.min(100, Math.max(0, p))) / 100;
  const lo = Math.floor(h);
  const hi = Math.min(n - 1, lo + 1);
  return sorted[lo] + (h - lo) * (sorted[hi] - sorted[lo]);
}

export interface Distribution {
  count: number;
  mean: number | null;
  min: number | null;
  p50: number | null;
  p90: number | null;
  p99: number | null;
  max: number | null;
}

/** The statistics every latency in the report gets. */
export function distribution(values: readonly number[]): Distribution {
  const sorted = [...values].sort((a, b) => a - b);
  const n = sorted.length;
  let sum = 0;
  for (const v of sorted) sum += v;
  return {
    count: n,
    mean: n > 0 ? sum / n : null,
    min: n > 0 ? sorted[0] : null,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    max: n > 0 ? sorted[n - 1] : null,
  };
}

export const PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy default, R type 7)";
