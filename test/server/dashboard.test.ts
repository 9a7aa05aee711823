/**
 * GET /dashboard/state (the JSON the dashboard page polls) against a local cluster of four real
 * sims (`infera up`'s machinery, in-process) under the kv-aware policy, with an API key set:
 * auth, shape, values that move as requests flow, and a decision naming the worker that served.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { startServer } from "../../src/server/app.ts";
import { DashboardState } from "../../src/server/dashboard/state.ts";
import { quantile } from "../../src/server/dashboard/window.ts";
import { type LocalCluster, startLocalCluster } from "../../src/server/local-cluster.ts";
import { freePort } from "../helpers/ports.ts";
import { mixedRecord } from "../helpers/records.ts";
import { parseMetric } from "../helpers/sim.ts";

const KEY = "dash-secret";

interface Snapshot {
  object: string;
  server: { policy: string; draining: boolean };
  models: Array<{
    name: string;
    router: string;
    workers: Array<{
      id: string;
      url: string;
      role: string;
      engine: string;
      state: string;
      inFlight: number;
      routed: number;
      waiting: number | null;
      kvUsage: number | null;
      indexBlocks: number | null;
    }>;
    pd: { pairs: unknown[]; transfers: unknown[] };
    traffic: {
      series: Array<{ t: number; rps: number; ttft: { p50: number | null }; e2e: { p99: number | null } }>;
      totals: { requests: number; promptTokens: number };
    };
  }>;
  decisions: Array<{
    requestId: string;
    step: string;
    winner: string;
    candidates: Array<{
      worker: string;
      scores: Record<string, number>;
      total: number | null;
      cachedBlocks: number | null;
      promptBlocks: number | null;
      bridgeBlocks: number | null;
    }>;
  }>;
}

async function state(url: string, headers: Record<string, string> = { authorization: `Bearer ${KEY}` }) {
  return fetch(`${url}/dashboard/state`, { headers });
}

async function snapshot(url: string): Promise<Snapshot> {
  const res = await state(url);
  assert.equal(res.status, 200);
  return (await res.json()) as Snapshot;
}

// A prompt long enough for several 16-token blocks, so the KV index sees shared prefixes.
const PREFIX = "You are a helpful assistant who answers questions about the solar system. ".repeat(8);

describe("GET /dashboard/state", () => {
  let cluster: LocalCluster;
  let url: string;
  let client: OpenAI;

  before(async () => {
    cluster = await startLocalCluster({
      workers: 4,
      model: "sim-model",
      policy: "kv-aware",
      port: await freePort(),
      host: "127.0.0.1",
      speed: 50,
      simArgs: [],
      apiKeys: [KEY],
      progress: () => {},
      handleSignals: false,
    });
    url = cluster.server.url;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEY, maxRetries: 0 });
  });
  after(async () => {
    await cluster?.stop();
  });

  it("needs the API key (header or ?key=) for the page and the state; the bundle is public", async () => {
    for (const res of [
      await state(url, {}),
      await state(url, { authorization: "Bearer wrong" }),
      await fetch(`${url}/dashboard`),
      await fetch(`${url}/dashboard?key=wrong`),
    ]) {
      assert.equal(res.status, 401);
      const body = (await res.json()) as { error: { type: string } };
      assert.ok(body.error.type, "an OpenAI-shaped error");
    }
    assert.equal((await state(url)).status, 200);
    assert.equal((await state(url, { "x-api-key": KEY })).status, 200);
    assert.equal((await fetch(`${url}/dashboard/state?key=${KEY}`)).status, 200);
    const page = await fetch(`${url}/dashboard?key=${KEY}`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get("content-type") ?? "", /text\/html/);
    const html = await page.text();
    assert.match(html, /<script src="\/dashboard\/app\.js">/);
    assert.doesNotMatch(html, /https?:\/\//, "nothing is loaded from elsewhere (no CDN)");
    const js = await fetch(`${url}/dashboard/app.js`);
    assert.equal(js.status, 200);
    assert.match(js.headers.get("content-type") ?? "", /javascript/);
    const code = await js.text();
    assert.ok(code.includes("u-legend"), "uPlot is bundled in");
    const css = await fetch(`${url}/dashboard/app.css`);
    assert.equal(css.status, 200);
    assert.match(await css.text(), /\.uplot/);
    assert.equal((await fetch(`${url}/dashboard/state`, { method: "POST" })).status, 405);
  });

  it("shows the four workers of the model, healthy, with the index's blocks", async () => {
    const s = await snapshot(url);
    assert.equal(s.object, "dashboard.state");
    assert.equal(s.server.policy, "kv-aware");
    assert.equal(s.server.draining, false);
    assert.equal(s.models.length, 1);
    const m = s.models[0]!;
    assert.equal(m.name, "sim-model");
    assert.equal(m.router, "mixed");
    assert.equal(m.workers.length, 4);
    const ids = new Set(cluster.sims.map((x) => x.record!.id));
    for (const w of m.workers) {
      assert.ok(ids.has(w.id), w.id);
      assert.equal(w.role, "mixed");
      assert.equal(w.engine, "sim");
      assert.equal(w.state, "healthy");
      assert.equal(typeof w.inFlight, "number");
      // kv-aware reads the KV index, and every sim publishes KV events: the index tracks them.
      assert.equal(typeof w.indexBlocks, "number");
    }
    assert.deepEqual(m.pd, { pairs: [], transfers: [] });
  });

  it("moves as requests flow: requests, routed, rates, latencies, index blocks, decisions", async () => {
    const before = await snapshot(url);
    const m0 = before.models[0]!;
    const routed0 = m0.workers.reduce((a, w) => a + w.routed, 0);
    const N = 16;
    await Promise.all(
      Array.from({ length: N }, async (_, i) => {
        const stream = await client.chat.completions.create({
          model: "sim-model",
          messages: [{ role: "user", content: `${PREFIX} Question ${i % 4}: tell me about planet ${i}.` }],
          max_tokens: 8,
          stream: true,
        });
        for await (const _chunk of stream) {
          // drain
        }
      }),
    );
    // The sims publish KV events asynchronously (the index catches up within a moment), the
    // engine load is scraped every 2 s, and traffic samples are taken at most once a second.
    let after: Snapshot = await snapshot(url);
    const deadline = Date.now() + 10_000;
    while (
      Date.now() < deadline &&
      !(
        after.models[0]!.workers.some((w) => (w.indexBlocks ?? 0) > 0) &&
        after.models[0]!.workers.every((w) => w.waiting !== null) &&
        // Samples are at most one a second: wait for one taken after the requests.
        after.models[0]!.traffic.series.some((x) => x.rps > 0)
      )
    ) {
      await new Promise((r) => setTimeout(r, 250));
      after = await snapshot(url);
    }
    const m = after.models[0]!;
    assert.equal(m.workers.reduce((a, w) => a + w.routed, 0) - routed0, N);
    assert.equal(m.traffic.totals.requests - m0.traffic.totals.requests, N);
    assert.ok(m.traffic.totals.promptTokens > m0.traffic.totals.promptTokens);
    assert.ok(
      m.workers.some((w) => (w.indexBlocks ?? 0) > 0),
      "the index holds blocks for a worker",
    );
    assert.ok(
      m.workers.every((w) => w.waiting !== null && w.kvUsage !== null),
      "engine load is scraped",
    );
    assert.ok(m.traffic.series.length >= 1);
    const p = m.traffic.series.find((x) => x.rps > 0);
    assert.ok(p, JSON.stringify(m.traffic.series));
    assert.ok(p.ttft.p50 !== null && p.ttft.p50 > 0);
    assert.ok(p.e2e.p99 !== null && p.e2e.p99 > 0);
    assert.ok(after.decisions.length >= N);
    const d = after.decisions[0]!;
    assert.equal(d.step, "mixed");
    assert.equal(d.candidates.length, 4);
    assert.ok(
      d.candidates.every((c) => "kv-prefix" in c.scores),
      JSON.stringify(d.candidates),
    );
  });

  it("names the worker that served a request in that request's decision", async () => {
    const count = async (u: string) =>
      // vLLM's request counter, a prometheus_client Counter "vllm:request_success" (exposed with _total):
      // vllm-project/vllm vllm/v1/metrics/loggers.py @ 005a810bc40faa25b8870fbc8559c3462581eee3
      parseMetric(await (await fetch(`${u}/metrics`)).text(), "vllm:request_success_total") ?? 0;
    const sims = cluster.sims;
    const counts0 = await Promise.all(sims.map((x) => count(x.url)));
    const rid = `dash-req-${Date.now()}`;
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}`, "x-request-id": rid },
      body: JSON.stringify({
        model: "sim-model",
        messages: [{ role: "user", content: PREFIX }],
        max_tokens: 2,
      }),
    });
    assert.equal(res.status, 200);
    await res.json();
    const counts1 = await Promise.all(sims.map((x) => count(x.url)));
    const served = sims.filter((_, i) => counts1[i]! > counts0[i]!);
    assert.equal(served.length, 1);
    const s = await snapshot(url);
    const d = s.decisions.find((x) => x.requestId === rid);
    assert.ok(d, `decision ${rid} in the feed`);
    assert.equal(d.winner, served[0]!.record!.id);
  });

  it("shows each candidate's absolute prompt overlap, as the KV index holds it", async () => {
    // Token ids nobody sent before (so no worker caches any of it): 200 tokens, 12 full blocks
    // at the sims' 16. Token-id prompts are hashed as given, so the test can ask the index.
    const tokens = Array.from({ length: 200 }, (_, i) => 3000 + ((i * 7919 + 17) % 90_000));
    const ids = cluster.sims.map((x) => x.record!.id);
    const index = cluster.server.kvIngest!.indexFor("sim-model")!;
    assert.deepEqual([...index.overlaps(tokens, ids)], [0, 0, 0, 0], "nobody holds the prompt yet");
    const send = async (rid: string) => {
      const res = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}`, "x-request-id": rid },
        body: JSON.stringify({ model: "sim-model", prompt: tokens, max_tokens: 2 }),
      });
      assert.equal(res.status, 200, await res.clone().text());
      await res.json();
    };
    const rid1 = `overlap-1-${Date.now()}`;
    await send(rid1);
    const first = (await snapshot(url)).decisions.find((x) => x.requestId === rid1)!;
    assert.ok(first, "first decision in the feed");
    assert.deepEqual(
      first.candidates.map((c) => [c.cachedBlocks, c.promptBlocks]),
      ids.map(() => [0, 12]),
      "a cold prompt: no candidate caches any of it",
    );
    // The sims publish KV events asynchronously: wait for the index to hold the prompt.
    const deadline = Date.now() + 10_000;
    while (Math.max(...index.overlaps(tokens, ids)) === 0 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 100));
    const held = [...index.overlaps(tokens, ids)];
    assert.ok(
      held.some((o) => o > 0),
      "the index holds the prompt on the worker that served it",
    );

    const rid2 = `overlap-2-${Date.now()}`;
    await send(rid2);
    const s = await snapshot(url);
    const d = s.decisions.find((x) => x.requestId === rid2)!;
    assert.ok(d, "second decision in the feed");
    assert.equal(d.winner, first.winner, "the cached worker wins");
    const now = [...index.overlaps(tokens, ids)];
    for (const c of d.candidates) {
      const at = ids.indexOf(c.worker);
      assert.equal(c.promptBlocks, 12);
      assert.equal(c.cachedBlocks, now[at], `${c.worker}: the index's overlap`);
      if (c.worker === d.winner) assert.ok(c.cachedBlocks! > 0, JSON.stringify(c));
      else assert.equal(c.cachedBlocks, 0, JSON.stringify(c));
      // kv-aware's kv-prefix cost is the uncached rest (weight 2).
      assert.equal(c.scores["kv-prefix"], 2 * (c.promptBlocks! - c.cachedBlocks!));
      // The first request's prefill is done and the index holds it: the bridge adds nothing.
      assert.equal(c.bridgeBlocks, 0, JSON.stringify(c));
    }
    // GET /debug/decisions carries the same numbers.
    const dbg = (await (
      await fetch(`${url}/debug/decisions?model=sim-model`, { headers: { authorization: `Bearer ${KEY}` } })
    ).json()) as { data: Snapshot["decisions"] };
    const same = dbg.data.find((x) => x.requestId === rid2)!;
    assert.deepEqual(
      same.candidates.map((c) => [c.worker, c.cachedBlocks, c.promptBlocks]),
      d.candidates.map((c) => [c.worker, c.cachedBlocks, c.promptBlocks]),
    );
  });
});

describe("dashboard quantiles", () => {
  it("interpolate inside the bucket, as Prometheus' histogram_quantile does", () => {
    const h = { buckets: [0.1, 0.2, 0.4], counts: new Float64Array([0, 10, 0]), count: 10 };
    assert.ok(Math.abs(quantile(h, 0.5)! - 0.15) < 1e-12);
    assert.equal(quantile({ ...h, count: 0 }, 0.5), null);
    // Above the last bound: reported as the last bound.
    assert.equal(quantile({ buckets: [0.1], counts: new Float64Array([0]), count: 3 }, 0.99), 0.1);
  });
});

describe("dashboard worker states and PD pairs", () => {
  it("maps an open breaker, a draining server and prefill/decode decisions", async (t) => {
    const server = await startServer({ host: "127.0.0.1", port: 0, discovery: { kind: "memory" } });
    t.after(() => server.close());
    const mk = (id: string, role: "prefill" | "decode") =>
      mixedRecord({ id, model: "m", url: `http://127.0.0.1:1/${id}`, role });
    server.memory!.put(mk("p0", "prefill"));
    server.memory!.put(mk("d0", "decode"));
    let draining = false;
    const state = new DashboardState({
      workers: server.workers,
      router: server.router,
      metrics: server.metrics,
      decisions: server.decisions,
      policy: "round-robin",
      draining: () => draining,
    });
    // A refused connection opens the breaker at once (src/router/worker-set.ts).
    server.workers.reportFailure(server.workers.get("p0")!, "connect");
    const all = server.workers.group("m")!.all;
    const p = all.findIndex((w) => w.id === "p0");
    const d = all.findIndex((w) => w.id === "d0");
    const totals = new Float64Array(all.length);
    const kept = all.map((_, i) => i);
    server.decisions.record("r1", "m", "prefill", all, kept, [], null, totals, p, "only");
    server.decisions.record("r1", "m", "decode", all, kept, [], null, totals, d, "only");
    // A decode step whose prefill is no longer in the ring is no pair.
    server.decisions.record("r2", "m", "decode", all, kept, [], null, totals, d, "only");
    let s = await state.snapshot();
    const m = s.models.find((x) => x.name === "m")!;
    const byId = new Map(m.workers.map((w) => [w.id, w]));
    assert.equal(byId.get("p0")!.state, "breaker-open");
    assert.equal(byId.get("p0")!.role, "prefill");
    assert.equal(byId.get("d0")!.state, "healthy");
    assert.equal(byId.get("d0")!.indexBlocks, null, "no KV index under round-robin");
    assert.deepEqual(m.pd.pairs, [{ prefill: "p0", decode: "d0", count: 1 }]);
    assert.deepEqual(
      m.pd.transfers.map((x) => [x.requestId, x.prefill, x.decode]),
      [["r1", "p0", "d0"]],
    );
    assert.deepEqual(
      s.decisions.map((x) => [x.requestId, x.step]),
      [
        ["r2", "decode"],
        ["r1", "decode"],
        ["r1", "prefill"],
      ],
      "newest first",
    );
    assert.ok(
      s.decisions.every((x) => x.candidates.every((c) => c.cachedBlocks === null && c.promptBlocks === null)),
      "recorded without an overlap source: no overlap to show",
    );
    draining = true;
    s = await state.snapshot();
    assert.equal(s.server.draining, true);
    assert.ok(s.models[0]!.workers.every((w) => w.state === "draining"));
  });
});
