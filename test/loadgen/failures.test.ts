import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { runBench } from "../../src/loadgen/runner.ts";
import type { BenchResult } from "../../src/loadgen/schema.ts";
import { freePort } from "../helpers/ports.ts";
import { type FakeServer, startFake } from "./fake-openai.ts";

function accounted(r: BenchResult): void {
  const s = r.summary.requests;
  assert.equal(s.ok + s.errors + s.not_sent, s.requested);
  const byKind = Object.values(r.summary.errors_by_kind).reduce((a, b) => a + b, 0);
  assert.equal(byKind, s.errors);
  assert.equal(r.requests.length, s.sent);
}

const base = {
  model: "m",
  workload: { kind: "synthetic" as const, inputLen: [5, 10] as [number, number] },
  seed: 1,
};

describe("a failing server yields error counts, not a crash", () => {
  it("nothing listening on the port: every request is a connection error", async () => {
    const port = await freePort();
    const r = await runBench({ ...base, url: `http://127.0.0.1:${port}`, requests: 5, concurrency: 2 });
    accounted(r);
    assert.deepEqual(r.summary.errors_by_kind, { connection: 5 });
    assert.equal(r.summary.requests.ok, 0);
    assert.equal(r.summary.latency_ms.ttft.p50, null);
  });

  const servers: FakeServer[] = [];
  after(async () => {
    for (const s of servers) await s.close();
  });
  const fake = async (...a: Parameters<typeof startFake>) => {
    const s = await startFake(...a);
    servers.push(s);
    return s;
  };

  it("a server that answers 500: http_500 per request", async () => {
    const s = await fake("500");
    for (const stream of [true, false]) {
      const r = await runBench({ ...base, url: s.url, requests: 4, concurrency: 4, stream });
      accounted(r);
      assert.deepEqual(r.summary.errors_by_kind, { http_500: 4 });
      assert.match(r.requests[0].error_message ?? "", /boom/);
    }
  });

  it("mixed failures are counted by kind", async () => {
    const modes = ["ok", "500", "malformed", "no-done", "drop", "stream-error", "hang", "ok"] as const;
    const s = await fake((n) => modes[n % modes.length], { chunks: 3, gapMs: 2 });
    // Only "hang" may run into the limit: at 400 ms, a loaded box's answers (each a few ms when
    // idle) ran into it too and were counted as timeouts (5 instead of 1, gc forced, load ~15).
    const r = await runBench({ ...base, url: s.url, requests: 8, concurrency: 1, timeoutMs: 2000 });
    accounted(r);
    assert.deepEqual(r.summary.errors_by_kind, {
      http_500: 1,
      malformed: 2,
      connection: 1,
      stream_error: 1,
      timeout: 1,
    });
    assert.equal(r.summary.requests.ok, 2);
    assert.deepEqual(
      r.requests.map((x) => x.error),
      [null, "http_500", "malformed", "malformed", "connection", "stream_error", "timeout", null],
    );
  });

  it("a malformed non-streamed body is counted as malformed", async () => {
    const s = await fake("malformed");
    const r = await runBench({ ...base, url: s.url, requests: 2, concurrency: 2, stream: false });
    assert.deepEqual(r.summary.errors_by_kind, { malformed: 2 });
  });
});

describe("measurements and limits against a scripted server", () => {
  let s: FakeServer;
  before(async () => {
    s = await startFake("ok", { chunks: 5, gapMs: 20, promptTokens: 100, cachedTokens: 25 });
  });
  after(() => s.close());

  it("streams: TTFT, chunk gaps, usage tokens and the request body", async () => {
    const r = await runBench({ ...base, url: s.url, requests: 3, concurrency: 3, maxTokens: 5 });
    accounted(r);
    const x = r.requests[0];
    assert.equal(x.ok, true);
    assert.equal(x.chunks, 5);
    assert.equal(x.itl_ms.length, 4);
    for (const g of x.itl_ms) assert.ok(g >= 10 && g < 200, `gap ${g}`);
    assert.ok((x.ttft_ms ?? 0) >= 15 && (x.ttft_ms ?? 0) < (x.e2e_ms ?? 0));
    assert.equal(x.prompt_tokens, 100);
    assert.equal(x.completion_tokens, 5);
    assert.equal(x.cached_tokens, 25);
    assert.equal(r.summary.prefix_cache_hit_rate, 0.25);
    const body = s.bodies[s.bodies.length - 1];
    assert.equal(body.model, "m");
    assert.equal(body.stream, true);
    assert.deepEqual(body.stream_options, { include_usage: true });
    assert.equal(body.max_tokens, 5);
    assert.ok(Array.isArray(body.messages));
  });

  it("multi-turn: 'actual' puts the server's replies in the history, 'standin' keeps fixed filler", async () => {
    for (const replies of ["actual", "standin"] as const) {
      const from = s.bodies.length;
      const r = await runBench({
        ...base,
        url: s.url,
        workload: { kind: "multi-turn", turns: 2, systemLen: 10, replies },
        requests: 4,
        concurrency: 4,
        maxTokens: 5,
      });
      assert.equal(r.summary.requests.ok, 4);
      const bodies = s.bodies.slice(from) as Array<{ messages: Array<{ role: string; content: string }> }>;
      const second = bodies.filter((b) => b.messages.length === 4);
      assert.equal(second.length, 2);
      for (const b of second) {
        assert.equal(b.messages[2].role, "assistant");
        if (replies === "actual") assert.equal(b.messages[2].content, "t0 t1 t2 t3 t4 ");
        else assert.equal(b.messages[2].content.split(" ").length, 5);
      }
      // A second turn is only sent after its first turn has finished.
      for (const x of r.requests.slice(2)) {
        const prev = r.requests[x.index - 2];
        assert.ok(x.start_ms >= prev.start_ms + (prev.e2e_ms ?? 0) - 1);
      }
    }
  });

  it("a trace with arrival times is replayed on schedule", async () => {
    const lines = [0, 100, 300].map((t) =>
      JSON.stringify({ arrival_ms: t, prompt: "hi there", max_tokens: 2 }),
    );
    const r = await runBench({ ...base, url: s.url, workload: { kind: "trace", lines }, concurrency: 8 });
    assert.equal(r.summary.requests.ok, 3);
    assert.equal(r.config.rate, null);
    r.requests.forEach((x, i) => {
      const due = [0, 100, 300][i];
      assert.ok(x.start_ms >= due - 1 && x.start_ms < due + 80, `request ${i} sent at ${x.start_ms} ms`);
    });
  });

  it("sends the API key, extra body fields and ignore_eos", async () => {
    const r = await runBench({
      ...base,
      url: `${s.url}/v1/`,
      requests: 1,
      concurrency: 1,
      apiKey: "sk-test",
      ignoreEos: true,
      extraBody: { cache_salt: "tenant-a" },
    });
    assert.equal(r.summary.requests.ok, 1);
    assert.equal(s.auth[s.auth.length - 1], "Bearer sk-test");
    const body = s.bodies[s.bodies.length - 1];
    assert.equal(body.cache_salt, "tenant-a");
    assert.equal(body.ignore_eos, true);
  });

  it("non-streamed: TTFT equals e2e", async () => {
    const r = await runBench({
      ...base,
      url: s.url,
      requests: 2,
      concurrency: 1,
      stream: false,
      endpoint: "completions",
    });
    const x = r.requests[0];
    assert.equal(x.ok, true);
    assert.equal(x.ttft_ms, x.e2e_ms);
    assert.equal(typeof s.bodies[s.bodies.length - 1].prompt, "string");
  });

  it("--duration stops sending; unsent requests are counted as not sent", async () => {
    const t0 = Date.now();
    const r = await runBench({ ...base, url: s.url, requests: 1000, rate: 20, durationS: 0.5 });
    accounted(r);
    assert.ok(Date.now() - t0 < 3000, "the run must end soon after the cap");
    assert.ok(r.summary.requests.not_sent > 900);
    assert.ok(
      r.summary.requests.sent >= 3 && r.summary.requests.sent <= 20,
      `sent ${r.summary.requests.sent}`,
    );
  });

  it("concurrency caps requests in flight", async () => {
    let peak = 0;
    const r = await runBench({
      ...base,
      url: s.url,
      requests: 12,
      concurrency: 3,
      onProgress: (p) => {
        peak = Math.max(peak, p.inFlight);
      },
    });
    accounted(r);
    assert.equal(r.summary.requests.ok, 12);
    assert.ok(peak <= 3 && peak >= 2, `peak ${peak}`);
  });

  it("a cancelled run returns with the in-flight requests marked cancelled", async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    const r = await runBench({ ...base, url: s.url, requests: 50, concurrency: 5, signal: ac.signal });
    accounted(r);
    assert.ok((r.summary.errors_by_kind.cancelled ?? 0) >= 1);
    assert.ok(r.summary.requests.not_sent > 0);
  });
});
