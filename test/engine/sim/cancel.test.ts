import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

async function gauges(sim: SimProcess): Promise<{ running: number; usage: number }> {
  const m = await sim.metrics();
  return {
    running: parseMetric(m, "vllm:num_requests_running") ?? -1,
    usage: parseMetric(m, "vllm:kv_cache_usage_perc") ?? -1,
  };
}

async function waitUntil(pred: () => Promise<boolean>, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error("condition not reached");
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe("sim cancellation: a client disconnect aborts the request and frees its blocks", () => {
  let sim: SimProcess;
  let client: OpenAI;
  const prompt = "Tell me a very long story about distributed caches. ".repeat(20);

  before(async () => {
    // Real time (speed 1) so that a 4000-token answer takes many seconds.
    sim = await startSim({ args: ["--speed", "1", "--num-gpu-blocks", "2000"] });
    client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
  });
  after(async () => {
    await sim?.stop();
  });

  it("an aborted stream drops the running count and KV usage at once", async () => {
    const stream = await client.chat.completions.create({
      model: sim.model,
      messages: [{ role: "user", content: prompt }],
      max_tokens: 4000,
      stream: true,
    });
    let chunks = 0;
    for await (const _chunk of stream) {
      if (++chunks < 5) continue;
      const live = await gauges(sim);
      assert.equal(live.running, 1);
      assert.ok(live.usage > 0);
      break;
    }
    // Breaking out of the iterator aborts the HTTP request.
    await waitUntil(async () => (await gauges(sim)).running === 0);
    const g = await gauges(sim);
    assert.equal(g.running, 0);
    assert.equal(g.usage, 0);
    const m = await sim.metrics();
    assert.equal(parseMetric(m, "vllm:request_success_total", { finished_reason: "abort" }), 1);
  });

  it("a non-streamed request is aborted too when its client goes away", async () => {
    const ac = new AbortController();
    const pending = fetch(`${sim.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: sim.model, prompt, max_tokens: 4000 }),
      signal: ac.signal,
    }).catch((err: unknown) => err);
    await waitUntil(async () => {
      const g = await gauges(sim);
      return g.running === 1 && g.usage > 0;
    });
    ac.abort();
    await pending;
    await waitUntil(async () => {
      const g = await gauges(sim);
      return g.running === 0 && g.usage === 0;
    });
    const m = await sim.metrics();
    assert.equal(parseMetric(m, "vllm:request_success_total", { finished_reason: "abort" }), 2);
  });
});
