import assert from "node:assert/strict";
import { execFile, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { compareResults, formatCompare } from "../../src/loadgen/compare.ts";
import { renderPlotHtml } from "../../src/loadgen/plot.ts";
import { formatTable } from "../../src/loadgen/report.ts";
import { runBench } from "../../src/loadgen/runner.ts";
import {
  type BenchResult,
  parseResult,
  RECORD_KEYS,
  RESULT_KEYS,
  SCHEMA_VERSION,
  SUMMARY_KEYS,
} from "../../src/loadgen/schema.ts";
import { type FakeServer, startFake } from "./fake-openai.ts";

const sorted = (o: object) => Object.keys(o).sort();

async function run(args: string[]): Promise<{ status: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, ["bin/infera.js", ...args], {
      encoding: "utf8",
      env: { ...process.env, INFERA_LOG_LEVEL: "warn" },
      timeout: 30_000,
    });
    return { status: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    return {
      status: typeof err.code === "number" ? err.code : -1,
      stdout: err.stdout ?? "",
      stderr: err.stderr ?? "",
    };
  }
}

describe("JSON schema, table, plot and compare", () => {
  let fast: FakeServer;
  let slow: FakeServer;
  let a: BenchResult;
  let b: BenchResult;
  const dir = mkdtempSync(join(tmpdir(), "bench-schema-"));
  before(async () => {
    fast = await startFake("ok", { chunks: 4, gapMs: 5 });
    slow = await startFake((n) => (n === 0 ? "500" : "ok"), { chunks: 4, gapMs: 20 });
    const common = {
      model: "m",
      workload: { kind: "doc-qa" as const, docLen: 50 },
      requests: 6,
      seed: 2,
      concurrency: 2,
    };
    a = await runBench({ ...common, url: fast.url, label: "fast", slo: { ttft_ms: 1000 } });
    b = await runBench({ ...common, url: slow.url, label: "slow", slo: { ttft_ms: 1000 } });
  });
  after(async () => {
    await fast.close();
    await slow.close();
  });

  it("has exactly the versioned keys", () => {
    assert.equal(a.schema_version, SCHEMA_VERSION);
    assert.equal(SCHEMA_VERSION, 1);
    assert.deepEqual(sorted(a), [...RESULT_KEYS].sort());
    assert.deepEqual(sorted(a.summary), [...SUMMARY_KEYS].sort());
    for (const r of a.requests) assert.deepEqual(sorted(r), [...RECORD_KEYS].sort());
    assert.deepEqual(sorted(a.summary.latency_ms), ["e2e", "itl", "tpot", "ttft"]);
    assert.deepEqual(sorted(a.summary.latency_ms.ttft), ["count", "max", "mean", "min", "p50", "p90", "p99"]);
    assert.deepEqual(sorted(a.summary.throughput), [
      "input_tokens_per_s",
      "output_tokens_per_s",
      "requests_per_s",
      "total_tokens_per_s",
    ]);
    assert.deepEqual(sorted(a.summary.requests), ["errors", "not_sent", "ok", "requested", "sent"]);
    assert.deepEqual(
      sorted(a.config),
      [
        "concurrency",
        "duration_cap_s",
        "endpoint",
        "max_tokens",
        "model",
        "percentile_method",
        "rate",
        "requests",
        "seed",
        "slo",
        "stream",
        "time_scale",
        "timeout_ms",
        "url",
        "label",
        "workload",
      ].sort(),
    );
    // Round-trips through JSON and is accepted by the reader.
    const back = parseResult(JSON.stringify(a));
    assert.deepEqual(back.summary, a.summary);
    assert.throws(() => parseResult(JSON.stringify({ ...a, schema_version: 99 })), /schema_version 99/);
    assert.throws(() => parseResult("{}"), /not an infera bench result/);
  });

  it("prints a summary table and a self-contained HTML plot", () => {
    const t = formatTable(b);
    assert.match(t, /requested 6, ok 5, errors 1, not sent 0/);
    assert.match(t, /http_500: 1/);
    assert.match(t, /TTFT/);
    assert.match(t, /goodput/);
    const html = renderPlotHtml(a);
    assert.match(html, /^<!doctype html>/);
    assert.equal((html.match(/<svg /g) ?? []).length, 3);
    assert.match(html, /Latency CDF/);
    assert.doesNotMatch(html, /<script|<link|<img|src=|href=/);
  });

  it("compare gives b/a ratios", () => {
    const rows = compareResults(a, b);
    const ok = rows.find((r) => r.metric === "ok requests");
    assert.deepEqual(ok && [ok.a, ok.b, ok.ratio], [6, 5, 5 / 6]);
    const itl = rows.find((r) => r.metric === "ITL p50 (ms)");
    assert.ok(itl?.ratio && itl.ratio > 1.5, `slow server's ITL ratio ${itl?.ratio}`);
    const text = formatCompare(a, b);
    assert.match(text, /slow \/ fast/);
    assert.match(text, /ok requests\s+6\.00\s+5\.00\s+0\.833x/);
  });

  it("`infera bench --compare a.json b.json` prints the ratios", () => {
    const fa = join(dir, "a.json");
    const fb = join(dir, "b.json");
    writeFileSync(fa, JSON.stringify(a));
    writeFileSync(fb, JSON.stringify(b));
    const res = spawnSync(process.execPath, ["bin/infera.js", "bench", "--compare", fa, fb], {
      encoding: "utf8",
    });
    assert.equal(res.status, 0, res.stderr);
    assert.match(res.stdout, /ok requests\s+6\.00\s+5\.00\s+0\.833x/);
    assert.match(res.stdout, /TTFT p99 \(ms\)/);
    const bad = spawnSync(
      process.execPath,
      ["bin/infera.js", "bench", "--compare", fa, join(dir, "nope.json")],
      {
        encoding: "utf8",
      },
    );
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /nope\.json/);
  });

  it("the CLI runs a benchmark, writes JSON and a plot, and shows plain progress when not a TTY", async () => {
    const out = join(dir, "r.json");
    const plot = join(dir, "p.html");
    // Async: the scripted server runs in this process and must keep answering.
    const res = await run([
      "bench",
      "--url",
      fast.url,
      "--model",
      "m",
      "--workload",
      "multi-turn",
      "--turns",
      "2",
      "--requests",
      "6",
      "--concurrency",
      "3",
      "--max-tokens",
      "4",
      "--slo-ttft-ms",
      "500",
      "--output",
      out,
      "--plot",
      plot,
    ]);
    assert.equal(res.status, 0, res.stderr);
    assert.match(res.stdout, /requested 6, ok 6, errors 0/);
    assert.match(res.stderr, /^bench: 6\/6 done/m);
    const r = parseResult(readFileSync(out, "utf8"));
    assert.equal(r.config.workload.kind, "multi-turn");
    assert.deepEqual(r.config.slo, { ttft_ms: 500 });
    assert.equal(r.summary.requests.ok, 6);
    assert.match(readFileSync(plot, "utf8"), /<svg /);
    const noRate = spawnSync(
      process.execPath,
      ["bin/infera.js", "bench", "--url", fast.url, "--model", "m"],
      {
        encoding: "utf8",
      },
    );
    assert.equal(noRate.status, 2);
    assert.match(noRate.stderr, /--rate R .* or --concurrency C/);
  });
});
