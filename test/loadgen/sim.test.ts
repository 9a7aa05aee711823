import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { runBench } from "../../src/loadgen/runner.ts";
import type { BenchResult } from "../../src/loadgen/schema.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";

function accounted(r: BenchResult): void {
  const s = r.summary.requests;
  assert.equal(s.ok + s.errors + s.not_sent, s.requested);
  assert.equal(r.requests.length, s.sent);
  assert.deepEqual(
    r.requests.map((x) => x.index),
    [...Array(s.sent).keys()],
  );
}

describe("infera bench against a spawned sim", () => {
  let sim: SimProcess;
  before(async () => {
    sim = await startSim({ args: ["--speed", "20"] });
  });
  after(async () => {
    await sim?.stop();
  });

  it("synthetic, closed loop, streamed: every request accounted for, usage tokens recorded", async () => {
    const r = await runBench({
      url: sim.url,
      model: sim.model,
      workload: { kind: "synthetic", inputLen: [50, 200] },
      requests: 24,
      concurrency: 4,
      maxTokens: 12,
      ignoreEos: true,
      seed: 1,
    });
    accounted(r);
    assert.equal(r.summary.requests.ok, 24, JSON.stringify(r.summary.errors_by_kind));
    for (const x of r.requests) {
      assert.equal(x.usage_reported, true);
      assert.equal(x.completion_tokens, 12);
      assert.ok((x.prompt_tokens ?? 0) >= 50, `prompt tokens ${x.prompt_tokens}`);
      assert.ok((x.ttft_ms ?? 0) > 0 && (x.ttft_ms ?? 0) <= (x.e2e_ms ?? 0));
      // The engine may merge tokens a slow reader has not taken yet into one event (as vLLM does),
      // so only the relation between chunks and gaps is fixed.
      assert.ok(x.chunks >= 1 && x.itl_ms.length === x.chunks - 1);
    }
    assert.equal(r.summary.tokens.completion, 24 * 12);
    assert.ok(r.summary.throughput.output_tokens_per_s > 0);
    assert.ok((r.summary.latency_ms.ttft.p50 ?? 0) <= (r.summary.latency_ms.ttft.p99 ?? 0));
  });

  it("doc-qa: requests over the same documents hit the prefix cache", async () => {
    const r = await runBench({
      url: sim.url,
      model: sim.model,
      workload: { kind: "doc-qa", documents: 2, docLen: 600 },
      requests: 12,
      concurrency: 1,
      maxTokens: 4,
      seed: 4,
    });
    accounted(r);
    assert.equal(r.summary.requests.ok, 12);
    const hit = r.summary.prefix_cache_hit_rate ?? 0;
    // 2 documents of ~600 tokens: after each document's first request, nearly all of it is cached.
    assert.ok(hit > 0.5, `prefix cache hit rate ${hit}`);
    assert.ok(r.requests.slice(2).some((x) => (x.cached_tokens ?? 0) >= 512));
  });

  it("multi-turn with Poisson arrivals: later turns reuse the history", async () => {
    const r = await runBench({
      url: sim.url,
      model: sim.model,
      workload: { kind: "multi-turn", turns: 3, systemPrompts: 2, systemLen: 300, replies: "actual" },
      requests: 12,
      rate: 40,
      concurrency: 8,
      maxTokens: 8,
      seed: 9,
    });
    accounted(r);
    assert.equal(r.summary.requests.ok, 12);
    const later = r.requests.filter((x) => x.index >= 4);
    assert.ok(later.every((x) => (x.cached_tokens ?? 0) > 0));
    // A turn's prompt is longer than its conversation's previous turn.
    for (const x of later) assert.ok((x.prompt_tokens ?? 0) > (r.requests[x.index - 4].prompt_tokens ?? 0));
  });

  it("same seed, same workload: identical prompt token counts on a second run", async () => {
    const opts = {
      url: sim.url,
      model: sim.model,
      workload: { kind: "synthetic" as const, inputLen: [20, 400] as [number, number] },
      requests: 8,
      concurrency: 8,
      maxTokens: 2,
      seed: 77,
    };
    const a = await runBench(opts);
    const b = await runBench(opts);
    const c = await runBench({ ...opts, seed: 78 });
    const tok = (r: BenchResult) => r.requests.map((x) => x.prompt_tokens);
    assert.deepEqual(tok(a), tok(b));
    assert.notDeepEqual(tok(a), tok(c));
  });

  it("non-streamed completions endpoint: TTFT equals e2e", async () => {
    const r = await runBench({
      url: sim.url,
      model: sim.model,
      workload: { kind: "synthetic", inputLen: [10, 30] },
      requests: 4,
      concurrency: 2,
      maxTokens: 5,
      stream: false,
      endpoint: "completions",
      seed: 3,
    });
    accounted(r);
    assert.equal(r.summary.requests.ok, 4, JSON.stringify(r.requests[0]));
    for (const x of r.requests) {
      assert.equal(x.ttft_ms, x.e2e_ms);
      assert.ok((x.completion_tokens ?? 0) >= 1);
    }
  });

  it("a wrong model name is counted as an HTTP error, not a crash", async () => {
    const r = await runBench({
      url: sim.url,
      model: "no-such-model",
      workload: { kind: "synthetic", inputLen: [5, 5] },
      requests: 3,
      concurrency: 3,
      seed: 1,
    });
    accounted(r);
    assert.equal(r.summary.requests.ok, 0);
    const kinds = Object.keys(r.summary.errors_by_kind);
    assert.equal(kinds.length, 1);
    assert.match(kinds[0], /^http_4\d\d$/);
  });
});
