import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { type Cluster, simMetric, startCluster } from "./cluster.ts";

describe("server proxy through two sims (official openai client)", () => {
  let c: Cluster;
  before(async () => {
    c = await startCluster(2);
  });
  after(async () => {
    await c?.close();
  });

  it("chat, non-streamed", async () => {
    const r = await c.client.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "Say hello" }],
      max_tokens: 5,
    });
    assert.equal(r.object, "chat.completion");
    assert.equal(typeof r.choices[0]!.message.content, "string");
    assert.equal(r.usage?.completion_tokens, 5);
  });

  it("chat, streamed: chunks pass through; no usage chunk unless asked", async () => {
    const stream = await c.client.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "Say hello" }],
      max_tokens: 6,
      stream: true,
    });
    let text = "";
    let chunks = 0;
    let sawUsage = false;
    let finish: string | null = null;
    for await (const ch of stream) {
      chunks++;
      if (ch.usage) sawUsage = true;
      text += ch.choices[0]?.delta?.content ?? "";
      finish = ch.choices[0]?.finish_reason ?? finish;
    }
    // The sim may put several tokens in one chunk at high --speed; the chunks still pass one by one.
    assert.ok(chunks >= 2, `got ${chunks} chunks`);
    assert.ok(text.length > 0);
    assert.equal(finish, "length");
    assert.equal(sawUsage, false, "the server's own include_usage chunk must be stripped");
  });

  it("chat, streamed with include_usage: the usage chunk reaches the client", async () => {
    const stream = await c.client.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "Say hello" }],
      max_tokens: 4,
      stream: true,
      stream_options: { include_usage: true },
    });
    let usage: { completion_tokens: number } | null = null;
    for await (const ch of stream) if (ch.usage) usage = ch.usage;
    assert.equal(usage?.completion_tokens, 4);
  });

  it("completions, non-streamed and streamed", async () => {
    const r = await c.client.completions.create({
      model: "sim-model",
      prompt: "Once upon a time",
      max_tokens: 3,
    });
    assert.equal(r.object, "text_completion");
    assert.equal(typeof r.choices[0]!.text, "string");
    assert.equal(r.usage?.completion_tokens, 3);
    const stream = await c.client.completions.create({
      model: "sim-model",
      prompt: [1, 2, 3, 4, 5],
      max_tokens: 4,
      stream: true,
    });
    let n = 0;
    for await (const ch of stream) if (ch.choices[0]?.text !== undefined) n++;
    assert.ok(n >= 1, `got ${n} text chunks`);
  });

  it("X-Request-Id is accepted, sent upstream and returned; generated when absent", async () => {
    const res = await fetch(`${c.server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": "req-test-42" },
      body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "x" }], max_tokens: 1 }),
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-request-id"), "req-test-42");
    const body = (await res.json()) as { id: string };
    assert.match(body.id, /req-test-42/, "the sim used the forwarded request id");
    const res2 = await fetch(`${c.server.url}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ model: "sim-model", prompt: "x", max_tokens: 1 }),
    });
    assert.match(res2.headers.get("x-request-id") ?? "", /^[0-9a-f-]{36}$/);
    await res2.text();
  });

  it("round-robin spreads exactly (sequential and concurrent)", async () => {
    const before = await Promise.all(c.sims.map((s) => simMetric(s, "vllm:request_success_total")));
    for (let i = 0; i < 10; i++) {
      await c.client.completions.create({ model: "sim-model", prompt: `seq ${i}`, max_tokens: 1 });
    }
    await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        c.client.chat.completions.create({
          model: "sim-model",
          messages: [{ role: "user", content: `conc ${i}` }],
          max_tokens: 2,
        }),
      ),
    );
    const afterCounts = await Promise.all(c.sims.map((s) => simMetric(s, "vllm:request_success_total")));
    const delta = afterCounts.map((v, i) => v - before[i]!);
    assert.deepEqual(delta, [15, 15]);
    assert.ok(
      c.server.workers.list().every((w) => w.inFlight === 0),
      "in-flight accounting returns to 0",
    );
  });

  it("logprobs and echo reach the engine and come back, streamed and not", async () => {
    const body = {
      model: "sim-model",
      messages: [{ role: "user" as const, content: "lp" }],
      max_tokens: 4,
      seed: 1,
      logprobs: true,
      top_logprobs: 2,
    };
    const whole = await c.client.chat.completions.create(body);
    const content = whole.choices[0].logprobs?.content ?? [];
    assert.equal(content.length, 4);
    assert.equal(content[0].top_logprobs.length, 2);
    const stream = await c.client.chat.completions.create({ ...body, stream: true });
    const tokens: string[] = [];
    for await (const chunk of stream)
      tokens.push(...(chunk.choices[0]?.logprobs?.content ?? []).map((t) => t.token));
    assert.deepEqual(
      tokens,
      content.map((t) => t.token),
    );
    const comp = await c.client.completions.create({
      model: "sim-model",
      prompt: "echo me",
      max_tokens: 2,
      echo: true,
    });
    assert.ok(comp.choices[0].text.startsWith("echo me"));
  });

  it("unknown extra fields (vLLM extras) pass through", async () => {
    const res = await fetch(`${c.server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        messages: [{ role: "user", content: "x" }],
        max_tokens: 2,
        cache_salt: "tenant-a",
        some_vendor_extra: { nested: [1, 2] },
      }),
    });
    assert.equal(res.status, 200);
    await res.json();
  });

  it("/metrics counts requests, tokens (from the injected usage), TTFT, decisions", async () => {
    const text = await (await fetch(`${c.server.url}/metrics`)).text();
    assert.match(text, /infera_requests_total\{model="sim-model",endpoint="chat",status="200"\} [1-9]/);
    assert.match(text, /infera_time_to_first_token_seconds_count\{model="sim-model"\} [1-9]/);
    assert.match(text, /infera_generation_tokens_total\{model="sim-model"\} [1-9]/);
    assert.match(
      text,
      /infera_routing_decisions_total\{policy="round-robin",reason="round-robin",router="mixed"\} [1-9]/,
    );
    assert.match(text, /infera_worker_in_flight\{worker="sim-0",model="sim-model"\} 0/);
  });

  it("/metrics times every routing decision in a histogram", async () => {
    const text = await (await fetch(`${c.server.url}/metrics`)).text();
    const decided = Number(
      /infera_routing_decisions_total\{policy="round-robin",reason="round-robin",router="mixed"\} (\d+)/.exec(
        text,
      )?.[1],
    );
    const timed = /infera_routing_decision_seconds_count\{policy="round-robin",router="mixed"\} (\d+)/.exec(
      text,
    );
    const sum = /infera_routing_decision_seconds_sum\{policy="round-robin",router="mixed"\} (\S+)/.exec(text);
    assert.ok(decided > 0);
    // One observation per decision, each a positive time well under a second.
    assert.equal(Number(timed?.[1]), decided);
    assert.ok(Number(sum?.[1]) > 0 && Number(sum?.[1]) < decided);
    assert.match(
      text,
      /infera_routing_decision_seconds_bucket\{policy="round-robin",router="mixed",le="\+Inf"\} \d+/,
    );
  });
});
