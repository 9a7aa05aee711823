import type { BenchResult } from "./schema.ts";
import type { RequestRecord } from "./types.ts";

interface Series {
  name: string;
  color: string;
  points: Array<[number, number]>;
}

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

/** An SVG line chart with axes and a legend; no scripts, no external resources. */
export function lineChart(
  title: string,
  xLabel: string,
  yLabel: string,
  series: Series[],
  logX = false,
): string {
  const W = 720;
  const H = 360;
  const m = { l: 70, r: 20, t: 36, b: 48 };
  const all = series.flatMap((s) => s.points);
  // Log axes clamp at 0.01 ms: chunks that arrive in one read have a gap of ~0.
  const tx = (x: number) => (logX ? Math.log10(Math.max(x, 0.01)) : x);
  let x0 = Math.min(...all.map((p) => tx(p[0])));
  let x1 = Math.max(...all.map((p) => tx(p[0])));
  let y1 = Math.max(...all.map((p) => p[1]));
  if (!Number.isFinite(x0)) [x0, x1, y1] = [0, 1, 1];
  if (x1 === x0) x1 = x0 + 1;
  if (!(y1 > 0)) y1 = 1;
  const sx = (x: number) => m.l + ((tx(x) - x0) / (x1 - x0)) * (W - m.l - m.r);
  const sy = (y: number) => H - m.b - (y / y1) * (H - m.t - m.b);
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="11">`,
  ];
  out.push(`<text x="${W / 2}" y="20" text-anchor="middle" font-size="14">${esc(title)}</text>`);
  out.push(
    `<rect x="${m.l}" y="${m.t}" width="${W - m.l - m.r}" height="${H - m.t - m.b}" fill="none" stroke="#999"/>`,
  );
  for (let i = 0; i <= 5; i++) {
    const yv = (y1 * i) / 5;
    const y = sy(yv);
    out.push(`<line x1="${m.l}" x2="${W - m.r}" y1="${y}" y2="${y}" stroke="#eee"/>`);
    out.push(`<text x="${m.l - 6}" y="${y + 4}" text-anchor="end">${+yv.toPrecision(3)}</text>`);
    const xv = x0 + ((x1 - x0) * i) / 5;
    const x = m.l + (i / 5) * (W - m.l - m.r);
    const label = logX ? 10 ** xv : xv;
    out.push(`<text x="${x}" y="${H - m.b + 16}" text-anchor="middle">${+label.toPrecision(3)}</text>`);
  }
  out.push(`<text x="${W / 2}" y="${H - 10}" text-anchor="middle">${esc(xLabel)}</text>`);
  out.push(
    `<text x="16" y="${H / 2}" text-anchor="middle" transform="rotate(-90 16 ${H / 2})">${esc(yLabel)}</text>`,
  );
  series.forEach((s, i) => {
    if (s.points.length > 0) {
      const d = s.points
        .map((p, j) => `${j === 0 ? "M" : "L"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`)
        .join("");
      out.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="1.6"/>`);
    }
    const ly = m.t + 14 + i * 14;
    out.push(`<rect x="${W - m.r - 150}" y="${ly - 8}" width="10" height="10" fill="${s.color}"/>`);
    out.push(`<text x="${W - m.r - 136}" y="${ly + 1}">${esc(s.name)}</text>`);
  });
  out.push("</svg>");
  return out.join("\n");
}

/** Empirical CDF as step points, thinned to at most ~400 points. */
export function cdfPoints(values: readonly number[]): Array<[number, number]> {
  const s = [...values].sort((a, b) => a - b);
  const n = s.length;
  const step = Math.max(1, Math.floor(n / 400));
  const pts: Array<[number, number]> = [];
  for (let i = 0; i < n; i += step) pts.push([s[i], (i + 1) / n]);
  if (n > 0 && pts[pts.length - 1][1] !== 1) pts.push([s[n - 1], 1]);
  return pts;
}

/**
 * Output tokens/s and completed requests/s per time bucket. A streamed request's tokens are
 * spread evenly over its chunks (first chunk at start + ttft, then the chunk gaps).
 */
export function throughputSeries(
  records: readonly RequestRecord[],
  bucketS?: number,
): { tok: Series; req: Series } {
  const ok = records.filter((r) => r.ok && r.e2e_ms !== null);
  const end = Math.max(0, ...ok.map((r) => r.start_ms + (r.e2e_ms ?? 0))) / 1000;
  const b = bucketS ?? Math.max(0.1, end / 60);
  const nb = Math.max(1, Math.ceil(end / b));
  const tok = new Array<number>(nb).fill(0);
  const req = new Array<number>(nb).fill(0);
  const at = (ms: number) => Math.min(nb - 1, Math.floor(ms / 1000 / b));
  for (const r of ok) {
    req[at(r.start_ms + (r.e2e_ms ?? 0))] += 1;
    const tokens = r.completion_tokens ?? 0;
    const chunks = Math.max(1, r.itl_ms.length + 1);
    let t = r.start_ms + (r.ttft_ms ?? r.e2e_ms ?? 0);
    tok[at(t)] += tokens / chunks;
    for (const g of r.itl_ms) {
      t += g;
      tok[at(t)] += tokens / chunks;
    }
  }
  const pts = (arr: number[]) => arr.map((v, i): [number, number] => [(i + 0.5) * b, v / b]);
  return {
    tok: { name: "output tok/s", color: "#1f77b4", points: pts(tok) },
    req: { name: "completed req/s", color: "#d62728", points: pts(req) },
  };
}

/** A self-contained HTML page: latency CDFs and throughput over time, as inline SVG. */
export function renderPlotHtml(r: BenchResult): string {
  const ok = r.requests.filter((x) => x.ok);
  const num = (v: number | null): v is number => v !== null;
  const ttft = ok.map((x) => x.ttft_ms).filter(num);
  const e2e = ok.map((x) => x.e2e_ms).filter(num);
  const itl = ok.flatMap((x) => x.itl_ms);
  const cdf = lineChart(
    "Latency CDF",
    "latency (ms, log scale)",
    "fraction of requests (ITL: of chunk gaps)",
    [
      { name: "TTFT", color: "#1f77b4", points: cdfPoints(ttft) },
      { name: "ITL", color: "#2ca02c", points: cdfPoints(itl) },
      { name: "E2E", color: "#d62728", points: cdfPoints(e2e) },
    ],
    true,
  );
  const { tok, req } = throughputSeries(r.requests);
  const tokChart = lineChart("Output throughput over time", "time since start (s)", "tokens/s", [tok]);
  const reqChart = lineChart("Completed requests over time", "time since start (s)", "requests/s", [req]);
  const s = r.summary;
  const title = `infera bench: ${r.config.workload.kind}${r.config.label ? ` [${r.config.label}]` : ""}`;
  return `<!doctype html>
<html><head><meta charset="utf-8"><title>${esc(title)}</title>
<style>body{font-family:sans-serif;margin:24px;color:#222}td,th{padding:2px 10px;text-align:right}th:first-child,td:first-child{text-align:left}</style>
</head><body>
<h2>${esc(title)}</h2>
<p>${esc(r.config.url)} · model ${esc(r.config.model)} · ${r.config.requests} requests · seed ${r.config.seed} · ${esc(r.created_at)}</p>
<table><tr><th>metric</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th></tr>
${(["ttft", "itl", "tpot", "e2e"] as const)
  .map((k) => {
    const d = s.latency_ms[k];
    const f = (v: number | null) => (v === null ? "-" : v.toFixed(2));
    return `<tr><td>${k.toUpperCase()} (ms)</td><td>${f(d.mean)}</td><td>${f(d.p50)}</td><td>${f(d.p90)}</td><td>${f(d.p99)}</td></tr>`;
  })
  .join("\n")}
</table>
<p>ok ${s.requests.ok} / ${s.requests.requested}, ${s.throughput.requests_per_s.toFixed(2)} req/s, ${s.throughput.output_tokens_per_s.toFixed(1)} output tok/s, prefix cache hit ${s.prefix_cache_hit_rate === null ? "-" : `${(s.prefix_cache_hit_rate * 100).toFixed(1)} %`}</p>
${cdf}
${tokChart}
${reqChart}
</body></html>
`;
}
