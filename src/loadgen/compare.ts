import { columns } from "./report.ts";
import type { BenchResult } from "./schema.ts";

export interface CompareRow {
  metric: string;
  a: number | null;
  b: number | null;
  /** b / a; null when either side is missing or a is 0. */
  ratio: number | null;
  /** Which direction is better, so a reader knows whether a ratio > 1 is a win. */
  better: "lower" | "higher";
}

export function compareResults(a: BenchResult, b: BenchResult): CompareRow[] {
  const rows: CompareRow[] = [];
  const add = (
    metric: string,
    f: (r: BenchResult) => number | null | undefined,
    better: "lower" | "higher",
  ) => {
    const va = f(a) ?? null;
    const vb = f(b) ?? null;
    const ratio = va !== null && vb !== null && va !== 0 ? vb / va : null;
    rows.push({ metric, a: va, b: vb, ratio, better });
  };
  add("ok requests", (r) => r.summary.requests.ok, "higher");
  add("errors", (r) => r.summary.requests.errors, "lower");
  add("duration (s)", (r) => r.summary.duration_s, "lower");
  add("throughput (req/s)", (r) => r.summary.throughput.requests_per_s, "higher");
  add("output (tok/s)", (r) => r.summary.throughput.output_tokens_per_s, "higher");
  add("total (tok/s)", (r) => r.summary.throughput.total_tokens_per_s, "higher");
  add("prefix cache hit rate", (r) => r.summary.prefix_cache_hit_rate, "higher");
  add("goodput (req/s)", (r) => r.summary.goodput?.requests_per_s, "higher");
  for (const k of ["ttft", "itl", "tpot", "e2e"] as const) {
    for (const p of ["mean", "p50", "p90", "p99"] as const) {
      add(`${k.toUpperCase()} ${p} (ms)`, (r) => r.summary.latency_ms[k][p], "lower");
    }
  }
  return rows;
}

function label(r: BenchResult, fallback: string): string {
  return r.config.label ?? fallback;
}

function f(v: number | null, digits = 2): string {
  return v === null || !Number.isFinite(v) ? "-" : v.toFixed(digits);
}

/** The side-by-side table of `infera bench --compare a.json b.json`. */
export function formatCompare(a: BenchResult, b: BenchResult, nameA = "A", nameB = "B"): string {
  const la = label(a, nameA);
  const lb = label(b, nameB);
  const rows = compareResults(a, b);
  const table = columns([
    ["metric", la, lb, `${lb} / ${la}`, "better"],
    ...rows.map((r) => [
      r.metric,
      f(r.a),
      f(r.b),
      r.ratio === null ? "-" : `${r.ratio.toFixed(3)}x`,
      r.better,
    ]),
  ]);
  return `A = ${la}: ${a.config.workload.kind}, ${a.config.requests} requests\nB = ${lb}: ${b.config.workload.kind}, ${b.config.requests} requests\n${table}`;
}
