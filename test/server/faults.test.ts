import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import { type Cluster, simMetric, startCluster, waitFor } from "./cluster.ts";

const RUNNING = "vllm:num_requests_running";

describe("client aborts reach the sim", () => {
  let c: Cluster;
  after(async () => {
    await c?.close();
  });

  it("streamed: aborting after the first chunk stops the request on the sim", async () => {
    // Real-time speed and many tokens: the request would run for minutes if not cancelled.
    c = await startCluster(1, { simArgs: ["--speed", "1"] });
    const sim = c.sims[0]!;
    const ac = new AbortController();
    const stream = await c.client.chat.completions.create(
      { model: "sim-model", messages: [{ role: "user", content: "long" }], max_tokens: 5000, stream: true },
      { signal: ac.signal },
    );
    let got = 0;
    try {
      for await (const _ of stream) {
        if (++got === 2) {
          assert.equal(await simMetric(sim, RUNNING), 1);
          ac.abort();
        }
      }
    } catch {
      // The client library may end the iteration quietly or throw an abort error.
    }
    assert.ok(got < 100, `the stream stopped after the abort (${got} chunks)`);
    await waitFor(async () => (await simMetric(sim, RUNNING)) === 0, 3000, "sim running count to drop");
    await waitFor(() => c.server.workers.list()[0]!.inFlight === 0, 2000, "server in-flight to drop");
    // Chunks were relayed one by one while the sim was still generating (timed as ITL).
    const text = await (await fetch(`${c.server.url}/metrics`)).text();
    assert.match(text, /infera_inter_token_latency_seconds_count\{model="sim-model"\} [1-9]/);
  });

  it("non-streamed: aborting while the sim computes stops the request on the sim", async () => {
    const sim = c.sims[0]!;
    const ac = new AbortController();
    const p = fetch(`${c.server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        messages: [{ role: "user", content: "long" }],
        max_tokens: 5000,
      }),
      signal: ac.signal,
    });
    p.catch(() => {});
    await waitFor(async () => (await simMetric(sim, RUNNING)) === 1, 3000, "request to start on the sim");
    ac.abort();
    await assert.rejects(p);
    await waitFor(async () => (await simMetric(sim, RUNNING)) === 0, 3000, "sim running count to drop");
    const metrics = await (await fetch(`${c.server.url}/metrics`)).text();
    assert.match(metrics, /infera_client_aborts_total\{model="sim-model"\} 2/);
  });
});

describe("worker 4xx answers", () => {
  let c: Cluster;
  after(async () => {
    await c?.close();
  });

  it("pass through unchanged (streamed or not) and never open the breaker", async () => {
    c = await startCluster(1, { simArgs: ["--speed", "100", "--max-model-len", "1024"] });
    for (const stream of [false, true, false, true]) {
      const res = await fetch(`${c.server.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "sim-model",
          messages: [{ role: "user", content: "x" }],
          max_tokens: 5000,
          stream,
        }),
      });
      assert.equal(res.status, 400);
      const body = (await res.json()) as { error: { code: string } };
      assert.equal(body.error.code, "context_length_exceeded");
    }
    const w = c.server.workers.get("sim-0")!;
    assert.equal(w.available, true);
    assert.equal(w.consecutiveFailures, 0);
    assert.equal(w.inFlight, 0);
  });
});

describe("a sim killed mid-test", () => {
  let c: Cluster;
  after(async () => {
    await c?.close();
  });

  it("later requests still succeed (retry on another worker + breaker)", async () => {
    c = await startCluster(3, { config: { breaker: { cooldownMs: 60_000 } } });
    const ask = () =>
      c.client.chat.completions.create({
        model: "sim-model",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 2,
      });
    for (let i = 0; i < 6; i++) await ask();
    c.sims[1]!.kill();
    await new Promise<void>((r) => c.sims[1]!.child.once("exit", () => r()));
    const results = await Promise.allSettled(Array.from({ length: 12 }, ask));
    assert.deepEqual(
      results.filter((r) => r.status === "rejected").map((r) => String((r as PromiseRejectedResult).reason)),
      [],
    );
    for (let i = 0; i < 6; i++) await ask();
    const dead = c.server.workers.get("sim-1")!;
    assert.equal(dead.available, false, "the dead worker is out of rotation");
    assert.equal(dead.breaker, "open");
    const metrics = await (await fetch(`${c.server.url}/metrics`)).text();
    assert.match(metrics, /infera_retries_total\{model="sim-model",reason="connect"\} [1-9]/);
    assert.match(metrics, /infera_worker_available\{worker="sim-1",model="sim-model"\} 0/);
    // Once nothing is left, the answer is 503 with Retry-After, not a hang or a crash.
    c.sims[0]!.kill();
    c.sims[2]!.kill();
    await Promise.all([0, 2].map((i) => new Promise<void>((r) => c.sims[i]!.child.once("exit", () => r()))));
    const res = await fetch(`${c.server.url}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "x" }] }),
    });
    assert.equal(res.status, 503);
    assert.ok(res.headers.get("retry-after"));
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, "no_worker_available");
  });
});
