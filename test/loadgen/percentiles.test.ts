import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { distribution, percentile } from "../../src/loadgen/percentiles.ts";
import { meetsSlo, summarize } from "../../src/loadgen/summary.ts";
import type { RequestRecord } from "../../src/loadgen/types.ts";

const close = (a: number | null, b: number) =>
  assert.ok(a !== null && Math.abs(a - b) < 1e-9, `${a} != ${b}`);

describe("percentiles (linear interpolation, numpy default)", () => {
  it("matches a hand-computed odd-sized set", () => {
    // sorted 15 20 35 40 50; rank h = (n-1)p/100 = 4p/100
    const s = [15, 20, 35, 40, 50];
    close(percentile(s, 0), 15);
    close(percentile(s, 50), 35); // h = 2
    close(percentile(s, 90), 46); // h = 3.6: 40 + 0.6 * 10
    close(percentile(s, 99), 49.6); // h = 3.96: 40 + 0.96 * 10
    close(percentile(s, 100), 50);
    close(percentile(s, 25), 20); // h = 1
    close(percentile(s, 40), 29); // h = 1.6: 20 + 0.6 * 15
  });

  it("matches a hand-computed even-sized set and sorts its input", () => {
    const d = distribution([4, 1, 3, 2]);
    close(d.p50, 2.5); // h = 1.5
    close(d.p90, 3.7); // h = 2.7
    close(d.p99, 3.97); // h = 2.97
    close(d.mean, 2.5);
    assert.equal(d.min, 1);
    assert.equal(d.max, 4);
    assert.equal(d.count, 4);
  });

  it("gives nulls for an empty set and the value for a single one", () => {
    const e = distribution([]);
    assert.equal(e.p50, null);
    assert.equal(e.mean, null);
    assert.equal(percentile([7], 99), 7);
  });
});

function rec(i: number, over: Partial<RequestRecord>): RequestRecord {
  return {
    index: i,
    group: null,
    ok: true,
    error: null,
    error_message: null,
    start_ms: 0,
    ttft_ms: 10,
    e2e_ms: 100,
    itl_ms: [],
    tpot_ms: null,
    prompt_tokens: 100,
    completion_tokens: 10,
    cached_tokens: 0,
    usage_reported: true,
    chunks: 10,
    ...over,
  };
}

describe("summarize", () => {
  const records: RequestRecord[] = [
    rec(0, { ttft_ms: 10, e2e_ms: 100, itl_ms: [5, 15], tpot_ms: 10, cached_tokens: 50 }),
    rec(1, { ttft_ms: 30, e2e_ms: 300, itl_ms: [25], tpot_ms: 30, cached_tokens: 0 }),
    rec(2, { ok: false, error: "http_500", ttft_ms: null, e2e_ms: null, prompt_tokens: null }),
    rec(3, { ok: false, error: "connection", ttft_ms: null, e2e_ms: null }),
    rec(4, {
      ttft_ms: 20,
      e2e_ms: 200,
      tpot_ms: 20,
      prompt_tokens: 200,
      cached_tokens: 100,
      usage_reported: true,
    }),
  ];
  const s = summarize(records, { requested: 6, durationMs: 2000, slo: { ttft_ms: 25, itl_ms: 25 } });

  it("accounts for every request", () => {
    assert.deepEqual(s.requests, { requested: 6, sent: 5, ok: 3, errors: 2, not_sent: 1 });
    assert.equal(s.requests.ok + s.requests.errors + s.requests.not_sent, s.requests.requested);
    assert.deepEqual(s.errors_by_kind, { http_500: 1, connection: 1 });
  });

  it("computes throughput, tokens and the cache hit rate over successful requests", () => {
    assert.equal(s.duration_s, 2);
    close(s.throughput.requests_per_s, 1.5);
    assert.equal(s.tokens.prompt, 400);
    assert.equal(s.tokens.completion, 30);
    close(s.throughput.output_tokens_per_s, 15);
    close(s.throughput.total_tokens_per_s, 215);
    close(s.prefix_cache_hit_rate, 150 / 400);
  });

  it("pools inter-token gaps and takes percentiles per metric", () => {
    assert.equal(s.latency_ms.itl.count, 3);
    close(s.latency_ms.itl.p50, 15);
    close(s.latency_ms.ttft.p50, 20);
    close(s.latency_ms.e2e.p90, 280); // 100 200 300: h = 1.8 → 200 + 0.8 * 100
  });

  it("counts goodput against every given SLO", () => {
    // request 0 meets both; 1 misses ttft; 4 meets both (tpot 20 <= 25)
    assert.ok(s.goodput);
    assert.equal(s.goodput.good, 2);
    close(s.goodput.fraction, 2 / 6);
    close(s.goodput.requests_per_s, 1);
    assert.equal(meetsSlo(records[2], {}), false);
    assert.equal(summarize(records).goodput, null);
  });
});
