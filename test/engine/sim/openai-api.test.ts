import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

describe("sim OpenAI API (spawned, official openai client)", () => {
  let sim: SimProcess;
  let client: OpenAI;
  const tok = getDefaultTokenizer();

  before(async () => {
    sim = await startSim({
      args: ["--speed", "50", "--max-model-len", "2048", "--served-model-name", "sim-model", "alias"],
    });
    client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
  });
  after(async () => {
    await sim?.stop();
  });

  it("lists the served model names", async () => {
    const models = await client.models.list();
    assert.deepEqual(
      models.data.map((m) => m.id),
      ["sim-model", "alias"],
    );
  });

  it("chat completion, non-streamed: exact usage from the shared tokenizer", async () => {
    const messages = [
      { role: "system" as const, content: "You are terse." },
      { role: "user" as const, content: "Say something about caches." },
    ];
    const r = await client.chat.completions.create({ model: "sim-model", messages, max_tokens: 17 });
    const expectedPrompt = tok.encode(tok.applyChatTemplate(messages)).length;
    assert.equal(r.object, "chat.completion");
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].finish_reason, "length");
    assert.equal(r.choices[0].message.role, "assistant");
    assert.ok((r.choices[0].message.content ?? "").length > 0);
    assert.equal(r.usage?.prompt_tokens, expectedPrompt);
    assert.equal(r.usage?.completion_tokens, 17);
    assert.equal(r.usage?.total_tokens, expectedPrompt + 17);
  });

  it("chat completion, streamed with include_usage: deltas join to the text, final usage chunk", async () => {
    const stream = await client.chat.completions.create({
      model: "alias",
      messages: [{ role: "user", content: "stream please" }],
      max_completion_tokens: 9,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    let sawRole = false;
    for await (const chunk of stream) {
      if (chunk.usage) {
        usage = chunk.usage;
        assert.equal(chunk.choices.length, 0);
      }
      for (const c of chunk.choices) {
        if (c.delta.role === "assistant") sawRole = true;
        text += c.delta.content ?? "";
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.ok(sawRole);
    assert.equal(finish, "length");
    assert.equal(usage?.completion_tokens, 9);
    assert.ok(text.length > 0);
  });

  it("completions, non-streamed and streamed give the same deterministic text for the same seed", async () => {
    const prompt = "The engine under test reads this prompt";
    const a = await client.completions.create({ model: "sim-model", prompt, max_tokens: 12, seed: 7 });
    assert.equal(a.object, "text_completion");
    assert.equal(a.usage?.prompt_tokens, tok.encode(prompt).length);
    assert.equal(a.usage?.completion_tokens, 12);
    const s = await client.completions.create({
      model: "sim-model",
      prompt,
      max_tokens: 12,
      seed: 7,
      stream: true,
    });
    let text = "";
    for await (const chunk of s) text += chunk.choices[0]?.text ?? "";
    assert.equal(text, a.choices[0].text);
    const c = await client.completions.create({ model: "sim-model", prompt, max_tokens: 12, seed: 8 });
    assert.notEqual(c.choices[0].text, a.choices[0].text);
  });

  it("n > 1 returns n choices; stop strings cut the text", async () => {
    const r = await client.completions.create({
      model: "sim-model",
      prompt: "many choices",
      max_tokens: 6,
      n: 3,
    });
    assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1, 2]);
    assert.equal(r.usage?.completion_tokens, 18);
    const base = await client.completions.create({
      model: "sim-model",
      prompt: "stop test",
      max_tokens: 30,
      seed: 3,
    });
    const words = base.choices[0].text.trim().split(" ");
    const stopWord = words[3];
    const cut = await client.completions.create({
      model: "sim-model",
      prompt: "stop test",
      max_tokens: 30,
      seed: 3,
      stop: [stopWord],
    });
    assert.equal(cut.choices[0].finish_reason, "stop");
    assert.equal(cut.choices[0].text, base.choices[0].text.slice(0, base.choices[0].text.indexOf(stopWord)));
  });

  it("a repeated prompt reports cached_tokens > 0 and the prefix cache metrics move", async () => {
    const long = "A shared system prompt that is long enough to fill several KV blocks. ".repeat(8);
    const messages = [{ role: "user" as const, content: long }];
    const first = await client.chat.completions.create({ model: "sim-model", messages, max_tokens: 3 });
    assert.equal(first.usage?.prompt_tokens_details?.cached_tokens, 0);
    const second = await client.chat.completions.create({ model: "sim-model", messages, max_tokens: 3 });
    const cached = second.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    const prompt = second.usage?.prompt_tokens ?? 0;
    assert.ok(cached > 0, "cached tokens reported");
    assert.equal(cached % 16, 0);
    assert.ok(cached >= prompt - 16 && cached < prompt);
    const m = await sim.metrics();
    assert.ok((parseMetric(m, "vllm:prefix_cache_hits_total") ?? 0) >= cached);
    assert.ok(
      (parseMetric(m, "vllm:prompt_tokens_by_source_total", { source: "local_cache_hit" }) ?? 0) >= cached,
    );
  });

  it("a prompt over --max-model-len gets a 400 in OpenAI's shape", async () => {
    await assert.rejects(
      client.completions.create({ model: "sim-model", prompt: "word ".repeat(3000), max_tokens: 10 }),
      (err: unknown) => {
        assert.ok(err instanceof OpenAI.BadRequestError);
        assert.equal(err.status, 400);
        assert.equal(err.code, "context_length_exceeded");
        assert.match(err.message, /maximum context length is 2048/);
        return true;
      },
    );
    const raw = await fetch(`${sim.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 5000,
      }),
    });
    assert.equal(raw.status, 400);
    const body = (await raw.json()) as { error: { type: string; message: string; code: string } };
    assert.equal(body.error.type, "invalid_request_error");
    assert.equal(body.error.code, "context_length_exceeded");
  });

  it("bad bodies get 400/404 in OpenAI's shape; X-Request-Id is echoed", async () => {
    const post = (body: string, headers: Record<string, string> = {}) =>
      fetch(`${sim.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body,
      });
    const bad = await post("{not json");
    assert.equal(bad.status, 400);
    assert.equal(((await bad.json()) as { error: { code: string } }).error.code, "invalid_json");
    const noMsgs = await post(JSON.stringify({ model: "sim-model", messages: [] }));
    assert.equal(noMsgs.status, 400);
    assert.equal(((await noMsgs.json()) as { error: { param: string } }).error.param, "messages");
    const wrongModel = await post(
      JSON.stringify({ model: "nope", messages: [{ role: "user", content: "x" }] }),
    );
    assert.equal(wrongModel.status, 404);
    // vLLM declares `min_tokens: int = 0` (not Optional): an explicit null is a 400 there —
    // vllm-project/vllm vllm/entrypoints/openai/chat_completion/protocol.py @ d5dba2d7b0ab9b98096560c69db7126b54b14d79
    const nullMin = await post(
      JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "x" }], min_tokens: null }),
    );
    assert.equal(nullMin.status, 400);
    assert.equal(((await nullMin.json()) as { error: { param: string } }).error.param, "min_tokens");
    const ok = await post(
      JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "x" }], max_tokens: 2 }),
      {
        "x-request-id": "req-abc-123",
      },
    );
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get("x-request-id"), "req-abc-123");
    assert.equal(((await ok.json()) as { id: string }).id, "chatcmpl-req-abc-123");
  });

  it("exposes vLLM's metric names with model_name and engine labels", async () => {
    const m = await sim.metrics();
    for (const name of [
      "vllm:num_requests_running",
      "vllm:num_requests_waiting",
      "vllm:kv_cache_usage_perc",
      "vllm:prefix_cache_queries_total",
      "vllm:prompt_tokens_total",
      "vllm:generation_tokens_total",
      "vllm:time_to_first_token_seconds_count",
      "vllm:inter_token_latency_seconds_count",
      "vllm:e2e_request_latency_seconds_count",
      "vllm:request_queue_time_seconds_count",
    ]) {
      assert.notEqual(parseMetric(m, name, { model_name: "sim-model", engine: "0" }), undefined, name);
    }
    assert.equal(parseMetric(m, "vllm:cache_config_info", { block_size: "16" }), 1);
    // Retired in vLLM V1 (vllm/v1/metrics/loggers.py serves vllm:kv_cache_usage_perc only).
    assert.equal(parseMetric(m, "vllm:gpu_cache_usage_perc"), undefined);
    assert.ok((parseMetric(m, "vllm:generation_tokens_total") ?? 0) > 0);
  });
});
