import type { Distribution } from "./percentiles.ts";
import type { BenchResult } from "./schema.ts";

function fmt(v: number | null | undefined, digits = 1): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return "-";
  return v.toFixed(digits);
}

function pad(s: string, w: number, left = false): string {
  return left ? s.padEnd(w) : s.padStart(w);
}

/** Renders rows as aligned columns (first column left-aligned, the rest right-aligned). */
export function columns(rows: string[][]): string {
  const widths: number[] = [];
  for (const r of rows) {
    r.forEach((c, i) => {
      widths[i] = Math.max(widths[i] ?? 0, c.length);
    });
  }
  return rows
    .map((r) =>
      r
        .map((c, i) => pad(c, widths[i], i === 0))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

function sloText(r: BenchResult): string {
  const s = r.config.slo;
  const parts: string[] = [];
  if (s.ttft_ms !== undefined) parts.push(`ttft<=${s.ttft_ms}ms`);
  if (s.itl_ms !== undefined) parts.push(`itl<=${s.itl_ms}ms`);
  if (s.e2e_ms !== undefined) parts.push(`e2e<=${s.e2e_ms}ms`);
  return parts.join(" ");
}

/** The summary table printed at the end of a run. */
export function formatTable(r: BenchResult): string {
  const s = r.summary;
  const c = r.config;
  const arrival = c.rate !== null ? `rate ${c.rate}/s` : "all at once";
  const conc = c.concurrency !== null ? `, concurrency ${c.concurrency}` : "";
  const lines: string[] = [];
  lines.push(
    `infera bench: ${c.workload.kind}${c.label ? ` [${c.label}]` : ""}, ${c.requests} requests, ${arrival}${conc}, ` +
      `${c.stream ? "streamed" : "not streamed"}, ${c.endpoint} endpoint, seed ${c.seed}`,
  );
  const errs = Object.entries(s.errors_by_kind)
    .sort()
    .map(([k, v]) => `${k}: ${v}`)
    .join(", ");
  const head: string[][] = [
    [
      "requests",
      `requested ${s.requests.requested}, ok ${s.requests.ok}, errors ${s.requests.errors}, not sent ${s.requests.not_sent}`,
    ],
  ];
  if (errs) head.push(["errors", errs]);
  head.push(["duration", `${fmt(s.duration_s, 2)} s`]);
  head.push([
    "throughput",
    `${fmt(s.throughput.requests_per_s, 2)} req/s, output ${fmt(s.throughput.output_tokens_per_s)} tok/s, ` +
      `total ${fmt(s.throughput.total_tokens_per_s)} tok/s`,
  ]);
  head.push([
    "tokens",
    `prompt ${s.tokens.prompt}, completion ${s.tokens.completion}, cached ${s.tokens.cached}` +
      (s.tokens.usage_missing > 0 ? ` (${s.tokens.usage_missing} answers without usage)` : ""),
  ]);
  head.push([
    "prefix cache hit",
    s.prefix_cache_hit_rate === null ? "-" : `${fmt(s.prefix_cache_hit_rate * 100)} % of prompt tokens`,
  ]);
  if (s.goodput) {
    head.push([
      "goodput",
      `${fmt(s.goodput.requests_per_s, 2)} req/s (${s.goodput.good} of ${s.requests.requested} = ` +
        `${fmt(s.goodput.fraction * 100)} % meet ${sloText(r)})`,
    ]);
  }
  lines.push(head.map(([k, v]) => `  ${k.padEnd(17)}${v}`).join("\n"));
  const row = (name: string, d: Distribution) => [
    name,
    String(d.count),
    fmt(d.mean, 2),
    fmt(d.p50, 2),
    fmt(d.p90, 2),
    fmt(d.p99, 2),
    fmt(d.max, 2),
  ];
  const lat = s.latency_ms;
  lines.push("");
  lines.push(
    columns([
      ["latency (ms)", "n", "mean", "p50", "p90", "p99", "max"],
      row("TTFT", lat.ttft),
      row("ITL", lat.itl),
      row("TPOT", lat.tpot),
      row("E2E", lat.e2e),
    ])
      .split("\n")
      .map((l) => `  ${l}`)
      .join("\n"),
  );
  lines.push(`  percentiles: ${c.percentile_method}`);
  return lines.join("\n");
}
