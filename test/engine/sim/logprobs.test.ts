import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { type SimProcess, startSim } from "../../helpers/sim.ts";

type Top = { token: string; logprob: number; bytes: number[] | null };

/** Ranked best first, a distribution (probabilities sum to at most 1), the token itself first. */
function assertRanked(token: string, logprob: number, top: readonly Top[], k: number): void {
  assert.equal(top.length, k);
  if (k === 0) return;
  assert.equal(top[0].token, token);
  assert.equal(top[0].logprob, logprob);
  for (let i = 1; i < top.length; i++) assert.ok(top[i].logprob < top[i - 1].logprob);
  const mass = top.reduce((s, t) => s + Math.exp(t.logprob), 0);
  assert.ok(mass <= 1 + 1e-9, `top probabilities sum to ${mass}`);
  assert.equal(new Set(top.map((t) => t.token)).size, k, "alternatives are distinct tokens");
}

describe("sim logprobs and echo (spawned, official openai client)", () => {
  let sim: SimProcess;
  let client: OpenAI;
  const tok = getDefaultTokenizer();

  before(async () => {
    sim = await startSim({ args: ["--speed", "50", "--max-model-len", "2048", "--max-logprobs", "5"] });
    client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
  });
  after(async () => {
    await sim?.stop();
  });

  const messages = [{ role: "user" as const, content: "Tell me about logprobs." }];

  // vLLM returns the prompt alone for echo with max_tokens 0 (the one token it samples is not
  // returned, but counted) and refuses max_tokens 0 without echo (SamplingParams: at least 1):
  // vllm-project/vllm vllm/entrypoints/openai/serving_completion.py @ 00463e627b4cbe549b5e9815a2bdb0100ae88ea9.
  it("completions echo with max_tokens 0: the prompt alone, streamed and not; without echo a 400", async () => {
    const prompt = "Once upon a time";
    const whole = await client.completions.create({ model: "sim-model", prompt, max_tokens: 0, echo: true });
    assert.equal(whole.choices[0].text, prompt);
    assert.equal(whole.choices[0].finish_reason, "length");
    assert.equal(whole.usage?.completion_tokens, 1);
    const stream = await client.completions.create({
      model: "sim-model",
      prompt,
      max_tokens: 0,
      echo: true,
      stream: true,
    });
    let text = "";
    for await (const c of stream) text += c.choices[0]?.text ?? "";
    assert.equal(text, prompt);
    await assert.rejects(
      client.completions.create({ model: "sim-model", prompt, max_tokens: 0 }),
      (e: unknown) => e instanceof OpenAI.APIError && e.status === 400,
    );
  });

  it("chat: one entry per output token, joining to the text, ranked alternatives, repeatable", async () => {
    const ask = () =>
      client.chat.completions.create({
        model: "sim-model",
        messages,
        max_tokens: 12,
        seed: 7,
        logprobs: true,
        top_logprobs: 3,
      });
    const r = await ask();
    const content = r.choices[0].logprobs?.content ?? [];
    assert.equal(content.length, 12);
    assert.equal(content.map((c) => c.token).join(""), r.choices[0].message.content);
    for (const c of content) {
      assert.ok(c.logprob < 0 && c.logprob > -1);
      assert.deepEqual(c.bytes, Array.from(Buffer.from(c.token, "utf8")));
      assertRanked(c.token, c.logprob, c.top_logprobs, 3);
    }
    const again = await ask();
    assert.deepEqual(again.choices[0].logprobs, r.choices[0].logprobs);

    const plain = await client.chat.completions.create({ model: "sim-model", messages, max_tokens: 3 });
    assert.equal(plain.choices[0].logprobs, null);
  });

  it("chat streamed: the chunks' logprobs add up to the non-streamed answer's", async () => {
    const body = { model: "sim-model", messages, max_tokens: 10, seed: 3, logprobs: true, top_logprobs: 2 };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    const got: OpenAI.Chat.Completions.ChatCompletionTokenLogprob[] = [];
    let text = "";
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      text += c.delta.content ?? "";
      got.push(...(c.logprobs?.content ?? []));
    }
    assert.equal(text, whole.choices[0].message.content);
    assert.deepEqual(got, whole.choices[0].logprobs?.content);
  });

  it("completions with echo and logprobs: prompt first (its first token without a logprob), offsets", async () => {
    const prompt = "Echo this prompt back please";
    const promptIds = tok.encode(prompt);
    const r = await client.completions.create({
      model: "sim-model",
      prompt,
      max_tokens: 6,
      seed: 11,
      echo: true,
      logprobs: 2,
    });
    const c = r.choices[0];
    assert.ok(c.text.startsWith(prompt), "echoed text starts with the prompt");
    const lp = c.logprobs;
    assert.ok(lp);
    const tokens = lp.tokens ?? [];
    assert.equal(tokens.length, promptIds.length + 6);
    assert.equal(tokens.join(""), c.text);
    assert.equal(lp.token_logprobs?.[0], null);
    assert.equal(lp.top_logprobs?.[0], null);
    let at = 0;
    for (let i = 0; i < tokens.length; i++) {
      assert.equal(lp.text_offset?.[i], at);
      at += tokens[i].length;
      if (i === 0) continue;
      const top = lp.top_logprobs?.[i] as Record<string, number>;
      assert.equal(Object.keys(top).length, 2);
      assert.equal(top[tokens[i]], lp.token_logprobs?.[i]);
    }
    assert.equal(r.usage?.prompt_tokens, promptIds.length);
    assert.equal(r.usage?.completion_tokens, 6);
  });

  it("completions logprobs 0 still reports the sampled token; echo alone adds no logprobs", async () => {
    const r = await client.completions.create({
      model: "sim-model",
      prompt: "zero",
      max_tokens: 4,
      logprobs: 0,
    });
    const top = r.choices[0].logprobs?.top_logprobs ?? [];
    assert.equal(top.length, 4);
    for (const [i, t] of top.entries()) {
      assert.deepEqual(Object.keys(t as object), [r.choices[0].logprobs?.tokens?.[i]]);
    }
    const e = await client.completions.create({
      model: "sim-model",
      prompt: [1, 2, 3],
      max_tokens: 2,
      echo: true,
    });
    assert.ok(e.choices[0].text.startsWith(tok.decode([1, 2, 3])));
    assert.equal(e.choices[0].logprobs, null);
  });

  it("completions streamed with echo: the prompt comes first per choice, then the same text", async () => {
    const body = {
      model: "sim-model",
      prompt: "stream echo",
      max_tokens: 5,
      seed: 5,
      n: 2,
      echo: true,
      logprobs: 1,
    };
    const whole = await client.completions.create(body);
    const stream = await client.completions.create({ ...body, stream: true });
    const text = ["", ""];
    const first: string[] = [];
    const tokens: string[][] = [[], []];
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        if (first[c.index] === undefined) first[c.index] = c.text;
        text[c.index] += c.text;
        tokens[c.index].push(...(c.logprobs?.tokens ?? []));
      }
    }
    for (const i of [0, 1]) {
      assert.equal(first[i], "stream echo");
      const w = whole.choices.find((c) => c.index === i);
      assert.equal(text[i], w?.text);
      assert.deepEqual(tokens[i], w?.logprobs?.tokens);
    }
  });

  it("chat echo (vLLM): a final assistant message is continued, streamed and not; otherwise nothing", async () => {
    const continued = [
      { role: "user" as const, content: "Write a line." },
      { role: "assistant" as const, content: "Once upon a time" },
    ];
    const body = { model: "sim-model", messages: continued, max_tokens: 5, seed: 9, echo: true };
    const plainBody = { ...body, echo: false };
    // `echo` is a vLLM extra on chat: sent as an unknown field through the official client.
    const whole = await client.chat.completions.create(
      body as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming,
    );
    const plain = await client.chat.completions.create(
      plainBody as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming,
    );
    assert.equal(whole.choices[0].message.content, `Once upon a time${plain.choices[0].message.content}`);
    assert.equal(whole.usage?.completion_tokens, 5);
    const stream = await client.chat.completions.create({
      ...body,
      stream: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming);
    const deltas: string[] = [];
    for await (const c of stream) if (c.choices[0]?.delta.content) deltas.push(c.choices[0].delta.content);
    assert.equal(deltas[0], "Once upon a time", "the echo is its own first content chunk");
    assert.equal(deltas.join(""), whole.choices[0].message.content);
    const userLast = await client.chat.completions.create({
      model: "sim-model",
      messages,
      max_tokens: 3,
      seed: 9,
      echo: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const userPlain = await client.chat.completions.create({
      model: "sim-model",
      messages,
      max_tokens: 3,
      seed: 9,
    });
    assert.equal(userLast.choices[0].message.content, userPlain.choices[0].message.content);
  });

  it("bad logprobs requests get 400 in OpenAI's shape, naming the field", async () => {
    const cases: [string, Record<string, unknown>, string][] = [
      ["/v1/chat/completions", { messages, top_logprobs: 2 }, "top_logprobs"],
      ["/v1/chat/completions", { messages, logprobs: true, top_logprobs: 6 }, "top_logprobs"],
      ["/v1/chat/completions", { messages, logprobs: "yes" }, "logprobs"],
      ["/v1/completions", { prompt: "x", logprobs: 6 }, "logprobs"],
      ["/v1/completions", { prompt: "x", echo: 1 }, "echo"],
    ];
    for (const [path, body, param] of cases) {
      const res = await fetch(`${sim.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "sim-model", max_tokens: 2, ...body }),
      });
      assert.equal(res.status, 400, JSON.stringify(body));
      const err = (await res.json()) as { error: { message: string; type: string; param: string } };
      assert.equal(err.error.param, param);
      assert.equal(err.error.type, "invalid_request_error");
      assert.ok(err.error.message.length > 0);
    }
  });
});
