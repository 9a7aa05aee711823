/**
 * The benchmark's tables, goal checks and plot page (the line charts of `infera bench`'s
 * renderer, src/loadgen/plot.ts).
 */
import { lineChart } from "../../src/loadgen/plot.ts";
import { type HotRecord, meetsSlo, type RunRecord, type Slo, type StepFigures } from "./stats.ts";

export interface Goal {
  name: string;
  figure: string;
  target: string;
  ok: boolean | null;
}

const f0 = (x: number) => (Number.isFinite(x) ? x.toFixed(0) : "∞");
const f1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "∞");
const pct = (x: number) => `${(100 * x).toFixed(1)}%`;

function find(runs: RunRecord[], workers: number, policy: string, replicas = 1): RunRecord | undefined {
  return runs.find((r) => r.workers === workers && r.policy === policy && r.replicas === replicas);
}

function totalHit(r: RunRecord): number {
  let c = 0;
  let p = 0;
  for (const s of r.steps) {
    c += s.cachedTokens;
    p += s.promptTokens;
  }
  return p > 0 ? c / p : 0;
}

/** The highest rate at which kv-aware (1 replica) met the SLO: TTFT p90 and ITL p50 in bounds. */
export function sloRateIndex(kv: RunRecord, slo: Slo): number {
  let best = -1;
  kv.steps.forEach((s, i) => {
    if (meetsSlo(s, slo)) best = i;
  });
  return best;
}

export function goals(runs: RunRecord[], hot: HotRecord[], slo: Slo, workers: number): Goal[] {
  const out: Goal[] = [];
  const kv = find(runs, workers, "kv-aware");
  const rr = find(runs, workers, "round-robin");
  const ap = find(runs, workers, "approx-prefix");
  const i = kv ? sloRateIndex(kv, slo) : -1;
  const at = (r: RunRecord | undefined) => (r && i >= 0 ? r.steps[i] : undefined);
  const k = at(kv);
  const where = k ? ` at ${k.rate}/s (${workers} workers; highest rate where kv-aware meets the SLO)` : "";
  const ratioGoal = (name: string, other: StepFigures | undefined, min: number) => {
    if (!k || !other) {
      out.push({
        name,
        figure: "n/a (not run, or kv-aware never met the SLO)",
        target: `≥ ${min}×`,
        ok: null,
      });
      return;
    }
    const r = other.ttftP90 / k.ttftP90;
    out.push({
      name,
      figure: `${f1(r)}× (${f0(other.ttftP90)} vs ${f0(k.ttftP90)} ms)${where}`,
      target: `≥ ${min}×`,
      ok: r >= min,
    });
  };
  ratioGoal("TTFT p90: round-robin / kv-aware", at(rr), 50);
  ratioGoal("TTFT p90: approx-prefix / kv-aware", at(ap), 10);
  const a = at(ap);
  if (k && a) {
    const r = k.goodput / a.goodput;
    out.push({
      name: "goodput at the SLO: kv-aware / approx-prefix",
      figure: `${f1(r)}× (${f1(k.goodput)} vs ${f1(a.goodput)} req/s)${where}`,
      target: "≥ 1.25×",
      ok: r >= 1.25,
    });
  } else
    out.push({
      name: "goodput at the SLO: kv-aware / approx-prefix",
      figure: "n/a",
      target: "≥ 1.25×",
      ok: null,
    });
  const kv4 = find(runs, workers, "kv-aware", 4);
  if (kv && kv4) {
    const h1 = totalHit(kv);
    const h4 = totalHit(kv4);
    const loss = 1 - h4 / h1;
    out.push({
      name: "hit rate lost by 4 replicas vs 1 (kv-aware)",
      figure: `${pct(loss)} (${pct(h4)} vs ${pct(h1)}, all steps)`,
      target: "≤ 2%",
      ok: loss <= 0.02,
    });
  } else
    out.push({
      name: "hit rate lost by 4 replicas vs 1 (kv-aware)",
      figure: "n/a",
      target: "≤ 2%",
      ok: null,
    });
  for (const h of hot.filter((x) => x.policy === "kv-aware")) {
    out.push({
      name: `hot spot (tenant 0 = 50% of traffic, ${h.rate}/s): max / mean worker load (kv-aware)`,
      figure: `${h.maxOverMeanRequests.toFixed(2)}× requests (${h.perWorker.map((p) => p.requests).join(", ")}), ${h.maxOverMeanPrefill.toFixed(2)}× prefill tokens`,
      target: "≤ 1.5×",
      ok: h.maxOverMeanRequests <= 1.5,
    });
  }
  return out;
}

export function printGoals(g: Goal[]): void {
  console.log("\n| goal | figure | target | |\n|---|---|---|---|");
  for (const x of g)
    console.log(
      `| ${x.name} | ${x.figure} | ${x.target} | ${x.ok === null ? "n/a" : x.ok ? "OK" : "MISSED"} |`,
    );
}

function row(label: string, s: StepFigures): string {
  return `| ${label} | ${s.rate} | ${f0(s.ttftP50)} | ${f0(s.ttftP90)} | ${f0(s.ttftP99)} | ${f1(s.itlP50)} | ${f1(s.throughput)} | ${f1(s.goodput)} | ${pct(s.hitRate)} | ${pct(s.ofReachable)} | ${s.ok}/${s.requests} | ${f0(s.cpu.fleetCore)}% / ${f0(s.cpu.fleetBox)}% | ${f0(s.cpu.serversCore)}% | ${f0(s.cpu.benchCore)}% | ${s.cpu.load1.toFixed(1)} |`;
}

const HEADER =
  "| policy × replicas | rate/s | TTFT p50 ms | p90 ms | p99 ms | ITL p50 ms | req/s | goodput | hit | of reachable | done | fleet CPU core / box | servers CPU | bench CPU | load 1m |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

export function printSteps(runs: RunRecord[], hot: HotRecord[], speed: string): void {
  console.log(
    `\nAll latencies and rates in model time (wall × the sims' --speed: ${speed}); CPU as % of one core over the step.`,
  );
  for (const w of [...new Set(runs.map((r) => r.workers))]) {
    console.log(`\n### ${w} workers\n\n${HEADER}`);
    for (const r of runs.filter((x) => x.workers === w))
      for (const s of r.steps) console.log(row(`${r.policy} × ${r.replicas}`, s));
    for (const r of runs.filter((x) => x.workers === w))
      console.log(
        `decisions ${r.policy} × ${r.replicas}: ${r.decisions}; per-worker requests ${r.perWorkerRequests.join(", ")}; engine preemptions ${r.preemptions}`,
      );
  }
  if (hot.length > 0) {
    console.log(`\n### hot spot: tenant 0 has 50% of the traffic\n\n${HEADER}`);
    for (const h of hot) console.log(row(`${h.policy} × 1`, h.step));
    for (const h of hot)
      console.log(
        `per-worker requests ${h.policy}: ${h.perWorker.map((p) => p.requests).join(", ")} → max/mean ${h.maxOverMeanRequests.toFixed(2)}; prefill tokens max/mean ${h.maxOverMeanPrefill.toFixed(2)}`,
      );
  }
}

const COLORS: Record<string, string> = {
  "round-robin": "#d62728",
  "approx-prefix": "#ff7f0e",
  "kv-aware": "#1f77b4",
  "kv-aware-classic": "#9467bd",
  "kv+queue": "#2ca02c",
};
const DASH = ["#1f77b4", "#9467bd", "#17becf", "#8c564b"];

/** Gives a chart's SVG its title as a <title> and aria-label (screen readers; biome's a11y rules). */
function titled(svg: string): string {
  return svg.replace(
    /^<svg ([^>]*)>\n(<text [^>]*>([^<]*)<\/text>)/,
    (_m, attrs: string, text: string, title: string) =>
      `<svg role="img" aria-label="${title}" ${attrs}>\n<title>${title}</title>\n${text}`,
  );
}

/** TTFT p90 (and goodput, hit rate) against rate per policy, one set of charts per worker count. */
export function renderHtml(runs: RunRecord[], slo: Slo, settings: Record<string, unknown>): string {
  const parts: string[] = [];
  for (const w of [...new Set(runs.map((r) => r.workers))]) {
    const rs = runs.filter((r) => r.workers === w);
    const series = (f: (s: StepFigures) => number) =>
      rs.map((r, i) => ({
        name: `${r.policy}${r.replicas > 1 ? ` ×${r.replicas}` : ""}`,
        color: r.replicas === 1 ? (COLORS[r.policy] ?? "#7f7f7f") : DASH[(i + 1) % DASH.length],
        points: r.steps.map((s): [number, number] => [s.rate, f(s)]),
      }));
    parts.push(`<h3>${w} workers</h3>`);
    parts.push(
      lineChart(
        `TTFT p90 vs offered rate, ${w} workers`,
        "offered rate (requests per model second)",
        "TTFT p90 (model s)",
        series((s) => (Number.isFinite(s.ttftP90) ? s.ttftP90 / 1000 : 0)),
      ),
    );
    parts.push(
      lineChart(
        `TTFT p90, log10, ${w} workers`,
        "offered rate (requests per model second)",
        "log10 TTFT p90 (model ms)",
        series((s) => Math.log10(Math.max(1, s.ttftP90))),
      ),
    );
    parts.push(
      lineChart(
        `Goodput (TTFT ≤ ${slo.ttftMs} ms, ITL ≤ ${slo.itlMs} ms), ${w} workers`,
        "offered rate",
        "good requests per model second",
        series((s) => s.goodput),
      ),
    );
    parts.push(
      lineChart(
        `Prefix-cache hit rate, ${w} workers`,
        "offered rate",
        "hit rate",
        series((s) => s.hitRate),
      ),
    );
  }
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infera bench: fleet-routing</title>
<style>body{font-family:sans-serif;margin:24px;color:#222}</style></head><body>
<h2>infera bench: fleet-routing (bench/fleet-routing)</h2>
<p>${Object.entries(settings)
    .map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : String(v)}`)
    .join(" · ")}</p>
${parts.map(titled).join("\n")}
</body></html>
`;
}

/** TTFT p90 (model s) per policy × replicas and rate, one table per worker count: the headline. */
export function printHeadline(runs: RunRecord[]): void {
  for (const w of [...new Set(runs.map((r) => r.workers))]) {
    const rs = runs.filter((r) => r.workers === w);
    const rates = rs[0]?.steps.map((s) => s.rate) ?? [];
    console.log(
      `\nTTFT p90 (model s) by offered rate, ${w} workers (≥: some requests unfinished, their wait counted)\n\n| policy | ${rates.map((r) => `${r}/s`).join(" | ")} | hit at ${rates[rates.length - 1]}/s |\n|---|${rates.map(() => "---|").join("")}---|`,
    );
    for (const r of rs) {
      const cells = r.steps.map((s) => `${s.unfinished > 0 ? "≥ " : ""}${(s.ttftP90 / 1000).toFixed(2)}`);
      const last = r.steps[r.steps.length - 1];
      console.log(
        `| ${r.policy}${r.replicas > 1 ? ` × ${r.replicas}` : ""} | ${cells.join(" | ")} | ${last && last.ok > 0 ? pct(last.hitRate) : "none finished"} |`,
      );
    }
  }
}
