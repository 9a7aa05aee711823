import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

async function completion(sim: SimProcess, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${sim.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: sim.model, ...body }),
  });
}

describe("sim under KV pressure and bad input", () => {
  let sim: SimProcess;

  before(async () => {
    sim = await startSim({
      args: [
        "--speed",
        "200",
        "--num-gpu-blocks",
        "30",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "256",
      ],
    });
  });
  after(async () => {
    await sim?.stop();
  });

  it("many concurrent long requests all finish exactly, with preemptions, and free everything", async () => {
    const reqs = Array.from({ length: 20 }, (_, i) =>
      completion(sim, {
        prompt: Array.from({ length: 100 }, (_, k) => 10 * i + k),
        max_tokens: 60,
        stream: i % 2 === 0,
      }).then(async (r) => {
        assert.equal(r.status, 200);
        const text = await r.text();
        if (i % 2 === 0) {
          assert.ok(text.endsWith("data: [DONE]\n\n"));
          assert.match(text, /"finish_reason":"length"/);
        } else {
          const body = JSON.parse(text) as { usage: { completion_tokens: number; prompt_tokens: number } };
          assert.equal(body.usage.completion_tokens, 60);
          assert.equal(body.usage.prompt_tokens, 100);
        }
      }),
    );
    await Promise.all(reqs);
    const m = await sim.metrics();
    assert.ok((parseMetric(m, "vllm:num_preemptions_total") ?? 0) > 0, "30 blocks cannot hold 8 x 10 blocks");
    assert.equal(parseMetric(m, "vllm:num_requests_running"), 0);
    assert.equal(parseMetric(m, "vllm:num_requests_waiting"), 0);
    assert.equal(parseMetric(m, "vllm:kv_cache_usage_perc"), 0);
    assert.equal(parseMetric(m, "vllm:generation_tokens_total"), 20 * 60);
  });

  it("a prompt larger than the whole pool is a 400, not a hang", async () => {
    const r = await completion(sim, { prompt: Array.from({ length: 600 }, (_, k) => k), max_tokens: 4 });
    assert.equal(r.status, 400);
    const body = (await r.json()) as { error: { type: string } };
    assert.equal(body.error.type, "invalid_request_error");
  });

  it("malformed requests get OpenAI-shaped 4xx answers and never crash the process", async () => {
    const bodies: unknown[] = [
      null,
      [],
      "text",
      42,
      { prompt: null },
      { prompt: [] },
      { prompt: [[]] },
      { prompt: [1.5, 2] },
      { prompt: [-1] },
      { prompt: "x", max_tokens: 0 },
      { prompt: "x", max_tokens: "5" },
      { prompt: "x", n: 0 },
      { prompt: "x", n: 1.5 },
      { prompt: "x", stop: 5 },
      { prompt: "x", stop: [1] },
      { prompt: "x", temperature: "hot" },
      { prompt: "x", stream: "yes" },
      { prompt: "x", stream_options: 3 },
      { prompt: "x", cache_salt: 7 },
      { prompt: "x", kv_transfer_params: [1] },
      { prompt: "x", seed: 1.2 },
      { prompt: "x", model: 5 },
    ];
    for (const b of bodies) {
      const r = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(b),
      });
      assert.ok(r.status >= 400 && r.status < 500, `${JSON.stringify(b)} -> ${r.status}`);
      const e = (await r.json()) as { error: { message: string; type: string } };
      assert.equal(typeof e.error.message, "string");
      assert.equal(typeof e.error.type, "string");
    }
    const chatBodies: unknown[] = [
      { messages: "hi" },
      { messages: [{ content: "no role" }] },
      { messages: [{ role: "user", content: 5 }] },
      { messages: [{ role: "user", content: [{ text: "no type" }] }] },
      { messages: [null] },
    ];
    for (const b of chatBodies) {
      const r = await fetch(`${sim.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(b),
      });
      assert.equal(r.status, 400, JSON.stringify(b));
    }
    const notFound = await fetch(`${sim.url}/v2/nothing`);
    assert.equal(notFound.status, 404);
    // Content parts are accepted (text parts joined).
    const parts = await fetch(`${sim.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }],
        max_tokens: 2,
      }),
    });
    assert.equal(parts.status, 200);
    assert.equal((await fetch(`${sim.url}/health`)).status, 200);
  });

  it("n > 1 streams every choice with its own index and finish_reason", async () => {
    const r = await completion(sim, { prompt: "choices", max_tokens: 5, n: 3, stream: true });
    const text = await r.text();
    const chunks = text
      .split("\n\n")
      .filter((l) => l.startsWith("data: {"))
      .map((l) => JSON.parse(l.slice(6)) as { choices: { index: number; finish_reason: string | null }[] });
    const finished = new Set<number>();
    for (const c of chunks) for (const ch of c.choices) if (ch.finish_reason) finished.add(ch.index);
    assert.deepEqual([...finished].sort(), [0, 1, 2]);
  });
});
