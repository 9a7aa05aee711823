/**
 * Real client SDKs through the server with sims (issue #31 item 6), mixed (two sims, the
 * server in-process, an API key) and disaggregated (1P1D nixl, `infera server` as a process):
 * the official `openai` SDK (chat, completions, streaming, Responses incl. its stream
 * accumulator, typed errors, abort), `@anthropic-ai/sdk` (messages.create, its MessageStream)
 * and `ai` + `@ai-sdk/openai-compatible` (generateText, streamText). Streams are read with the
 * SDKs' own parsers, so a Responses or Messages event that breaks their grammar fails here.
 *
 * The sims are vLLM personalities started with vLLM's tool flags (`--enable-auto-tool-choice
 * --tool-call-parser hermes`): vLLM refuses `tool_choice` "auto" without the first and
 * "required"/named choices without a parser (vllm-project/vllm
 * vllm/entrypoints/openai/serving_chat.py), so tool cases need both, as on a real deployment.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import Anthropic from "@anthropic-ai/sdk";
import { generateText, Output, streamText, tool } from "ai";
import OpenAI from "openai";
import { zodFunction, zodResponseFormat, zodTextFormat } from "openai/helpers/zod";
import { z } from "zod";
import { type PdCluster, startPdCluster } from "../../router/disagg/pd-cluster.ts";
import { type Cluster, startCluster } from "../cluster.ts";

const MODEL = "sim-model";
const KEY = "sk-client-test";
const TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"];

const WEATHER_TOOL = {
  type: "function",
  name: "get_weather",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  strict: true,
} as const;

interface Target {
  url: string;
  key: string;
}

/** `native`: the workers' records list the sims' own /v1/responses and /v1/messages. */
function clientCases(target: () => Target, native = false): void {
  const openai = () =>
    new OpenAI({ baseURL: `${target().url}/v1`, apiKey: target().key || "none", maxRetries: 0 });
  const anthropic = () =>
    new Anthropic({ baseURL: target().url, apiKey: target().key || "none", maxRetries: 0 });
  const compat = () =>
    createOpenAICompatible({
      name: "infera",
      baseURL: `${target().url}/v1`,
      apiKey: target().key || "none",
      includeUsage: true,
      // vLLM takes `response_format: json_schema` (guided decoding); without this flag the SDK
      // sends `json_object`, which constrains to some JSON object, not to the schema.
      supportsStructuredOutputs: true,
    });

  it("openai: chat, completions and a chat stream", async () => {
    const c = openai();
    const chat = await c.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "hello" }],
      max_tokens: 4,
    });
    assert.equal(chat.usage?.completion_tokens, 4);
    const cmpl = await c.completions.create({ model: MODEL, prompt: "hello", max_tokens: 3 });
    assert.equal(cmpl.usage?.completion_tokens, 3);
    const stream = await c.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "hello" }],
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage = 0;
    for await (const ch of stream) {
      text += ch.choices[0]?.delta?.content ?? "";
      usage = ch.usage?.completion_tokens ?? usage;
    }
    assert.ok(text.length > 0);
    assert.equal(usage, 5);
  });

  it("openai: typed errors and abort", async () => {
    const c = openai();
    await assert.rejects(
      c.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
      (e: unknown) => e instanceof OpenAI.NotFoundError,
    );
    const ac = new AbortController();
    const stream = await c.chat.completions.create(
      { model: MODEL, messages: [{ role: "user", content: "hello" }], max_tokens: 200, stream: true },
      { signal: ac.signal },
    );
    // openai-node ends the iteration quietly on its own abort (src/core/streaming.ts isAbortError).
    let n = 0;
    for await (const _ of stream) if (++n === 2) ac.abort();
    assert.ok(n < 50, `the stream stopped after the abort (${n} chunks)`);
    assert.equal(stream.controller.signal.aborted, true);
  });

  it("openai: responses.create, non-streamed, with instructions and input items", async () => {
    const r = await openai().responses.create({
      model: MODEL,
      instructions: "Be brief.",
      input: [
        { role: "user", content: [{ type: "input_text", text: "first" }] },
        { role: "assistant", content: "ok" },
        { role: "user", content: "second" },
      ],
      max_output_tokens: 6,
    });
    assert.equal(r.object, "response");
    // The sim stops at max_tokens: the Responses API reports that as incomplete.
    assert.equal(r.status, "incomplete");
    assert.equal(r.incomplete_details?.reason, "max_output_tokens");
    assert.ok(r.output_text.length > 0, "output_text (the SDK's own join of output_text parts)");
    assert.equal(r.usage?.output_tokens, 6);
    assert.ok((r.usage?.input_tokens ?? 0) > 0);
    assert.equal((r as unknown as { store?: boolean }).store, false);
  });

  it("openai: responses.stream, read with the SDK's ResponseStream accumulator", async () => {
    const s = openai().responses.stream({ model: MODEL, input: "tell me a story", max_output_tokens: 8 });
    const types: string[] = [];
    let deltas = "";
    s.on("event", (e) => types.push(e.type));
    s.on("response.output_text.delta", (e) => {
      deltas += e.delta;
    });
    const final = await s.finalResponse();
    assert.equal(types[0], "response.created");
    assert.equal(types[1], "response.in_progress");
    assert.equal(types.at(-1), "response.incomplete");
    for (const t of [
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
    ])
      assert.ok(types.includes(t), `${t} in ${types.join(",")}`);
    assert.equal(final.output_text, deltas);
    assert.equal(final.usage?.output_tokens, 8);
  });

  it("openai: responses with state are refused with a 400 naming the field", async () => {
    const c = openai();
    for (const [field, extra] of [
      ["previous_response_id", { previous_response_id: "resp_1" }],
      ["store", { store: true }],
    ] as const) {
      await assert.rejects(
        c.responses.create({ model: MODEL, input: "x", ...extra }),
        (e: unknown) =>
          e instanceof OpenAI.BadRequestError && (e.error as { param?: string }).param === field,
      );
    }
  });

  it("openai: responses with a required tool call", async () => {
    const r = await openai().responses.create({
      model: MODEL,
      input: "weather in Paris?",
      tools: [WEATHER_TOOL],
      tool_choice: "required",
    });
    const call = r.output.find((o) => o.type === "function_call");
    assert.equal(call?.type === "function_call" && call.name, "get_weather");
  });

  it("openai: a streamed required tool call, read with the SDK's ResponseStream", async () => {
    const s = openai().responses.stream({
      model: MODEL,
      input: "weather in Paris?",
      tools: [WEATHER_TOOL],
      tool_choice: "required",
    });
    const types = new Set<string>();
    for await (const e of s) types.add(e.type);
    const final = await s.finalResponse();
    assert.ok(types.has("response.function_call_arguments.delta"));
    assert.ok(types.has("response.function_call_arguments.done"));
    const call = final.output.find((o) => o.type === "function_call");
    assert.ok(call?.type === "function_call");
    assert.equal(typeof (JSON.parse(call.arguments) as { city?: unknown }).city, "string");
  });

  it("openai: runTools with a required tool, the runner calling it and finishing", async () => {
    let called = 0;
    const runner = openai().chat.completions.runTools({
      model: MODEL,
      messages: [{ role: "user", content: "weather in Paris?" }],
      tools: [
        zodFunction({
          name: "get_weather",
          parameters: z.object({ city: z.string() }),
          function: (a: { city: string }) => {
            called++;
            return `sunny in ${a.city}`;
          },
        }),
      ],
      tool_choice: "required",
      max_tokens: 50,
    });
    await runner.finalChatCompletion();
    assert.ok(called >= 1);
  });

  it("openai: chat .parse() and responses.parse() with a zod schema", async () => {
    const City = z.object({ name: z.string(), population: z.number().int() });
    const c = await openai().chat.completions.parse({
      model: MODEL,
      messages: [{ role: "user", content: "a city" }],
      response_format: zodResponseFormat(City, "city"),
      max_tokens: 100,
    });
    assert.equal(typeof c.choices[0]?.message.parsed?.name, "string");
    const r = await openai().responses.parse({
      model: MODEL,
      input: "a city",
      text: { format: zodTextFormat(City, "city") },
      max_output_tokens: 100,
    });
    assert.equal(typeof r.output_parsed?.population, "number");
  });

  it("ai sdk: toolChoice 'required' and a structured object output", async () => {
    const model = compat().chatModel(MODEL);
    const t = await generateText({
      model,
      prompt: "weather in Paris?",
      tools: {
        get_weather: tool({
          inputSchema: z.object({ city: z.string() }),
          execute: async ({ city }: { city: string }) => `sunny in ${city}`,
        }),
      },
      toolChoice: "required",
    });
    assert.ok(t.toolCalls.length >= 1);
    const o = await generateText({
      model,
      prompt: "a city",
      output: Output.object({ schema: z.object({ name: z.string() }) }),
    });
    assert.equal(typeof o.output.name, "string");
  });

  it("anthropic: messages.create with system and blocks", async () => {
    const m = await anthropic().messages.create({
      model: MODEL,
      system: "Be brief.",
      max_tokens: 5,
      messages: [
        { role: "user", content: [{ type: "text", text: "hi" }] },
        { role: "assistant", content: "hello" },
        { role: "user", content: "more" },
      ],
    });
    assert.equal(m.type, "message");
    assert.equal(m.role, "assistant");
    assert.equal(m.stop_reason, "max_tokens");
    assert.equal(m.usage.output_tokens, 5);
    assert.ok(m.usage.input_tokens > 0);
    assert.equal(m.content[0]?.type, "text");
  });

  it("anthropic: messages.stream, read with the SDK's MessageStream", async () => {
    const s = anthropic().messages.stream({
      model: MODEL,
      max_tokens: 7,
      messages: [{ role: "user", content: "tell me a story" }],
    });
    let text = "";
    const types: string[] = [];
    let startInput = -1;
    s.on("streamEvent", (e) => {
      types.push(e.type);
      if (e.type === "message_start") startInput = e.message.usage.input_tokens;
    });
    s.on("text", (d) => {
      text += d;
    });
    const final = await s.finalMessage();
    assert.deepEqual(
      [types[0], types[1], types.at(-3), types.at(-2), types.at(-1)],
      ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"],
    );
    assert.equal(final.content[0]?.type === "text" && final.content[0].text, text);
    assert.equal(final.stop_reason, "max_tokens");
    assert.equal(final.usage.output_tokens, 7);
    // message_start carries the count routing made of the same prompt; the engine's comes last.
    // Passed through, the engine's own message_start is relayed as it is.
    if (!native) assert.equal(startInput, final.usage.input_tokens);
    assert.ok(final.usage.input_tokens > 0);
  });

  it("anthropic: bad input comes back in Anthropic's error shape", async () => {
    await assert.rejects(
      anthropic().messages.create({ model: MODEL, messages: [{ role: "user", content: "x" }] } as never),
      (e: unknown) =>
        e instanceof Anthropic.BadRequestError &&
        (e.error as { type?: string; error?: { type?: string } }).type === "error" &&
        (e.error as { error?: { type?: string } }).error?.type === "invalid_request_error",
    );
  });

  it("anthropic: tools with tool_choice any", async () => {
    const m = await anthropic().messages.create({
      model: MODEL,
      max_tokens: 50,
      messages: [{ role: "user", content: "weather in Paris?" }],
      tools: [
        {
          name: "get_weather",
          input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
        },
      ],
      tool_choice: { type: "any" },
    });
    assert.equal(m.stop_reason, "tool_use");
    assert.equal(m.content.find((b) => b.type === "tool_use")?.type, "tool_use");
  });

  it("anthropic: a streamed tool_use, its input rebuilt by the SDK's MessageStream", async () => {
    const s = anthropic().messages.stream({
      model: MODEL,
      max_tokens: 50,
      messages: [{ role: "user", content: "weather in Paris?" }],
      tools: [
        {
          name: "get_weather",
          input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
        },
      ],
      tool_choice: { type: "tool", name: "get_weather" },
    });
    const final = await s.finalMessage();
    assert.equal(final.stop_reason, "tool_use");
    const use = final.content.find((b) => b.type === "tool_use");
    assert.ok(use?.type === "tool_use");
    assert.equal(use.name, "get_weather");
    assert.equal(typeof (use.input as { city?: unknown }).city, "string");
  });

  it("ai sdk: generateText and streamText", async () => {
    const model = compat().chatModel(MODEL);
    const g = await generateText({ model, prompt: "hello", maxOutputTokens: 4 });
    assert.ok(g.text.length > 0);
    assert.equal(g.usage.outputTokens, 4);
    const s = streamText({ model, prompt: "hello", maxOutputTokens: 5 });
    let text = "";
    for await (const d of s.textStream) text += d;
    assert.equal(text, await s.text);
    assert.ok(text.length > 0);
    assert.equal((await s.usage).outputTokens, 5);
  });
}

describe("client SDKs through the server, mixed (2 sims)", () => {
  let c: Cluster;
  before(async () => {
    c = await startCluster(2, {
      config: { apiKeys: [KEY] },
      simArgs: ["--speed", "100", "--seed", "1", ...TOOL_FLAGS],
    });
  });
  after(async () => {
    await c?.close();
  });
  clientCases(() => ({ url: c.server.url, key: KEY }));

  it("anthropic: x-api-key is the API key (a wrong one is refused in Anthropic's shape)", async () => {
    const bad = new Anthropic({ baseURL: c.server.url, apiKey: "wrong", maxRetries: 0 });
    await assert.rejects(
      bad.messages.create({ model: MODEL, max_tokens: 2, messages: [{ role: "user", content: "x" }] }),
      (e: unknown) =>
        e instanceof Anthropic.AuthenticationError &&
        (e.error as { error?: { type?: string } }).error?.type === "authentication_error",
    );
  });
});

describe("client SDKs through the server, mixed, Responses and Messages passed through", () => {
  let c: Cluster;
  before(async () => {
    c = await startCluster(2, {
      simArgs: ["--speed", "100", "--seed", "1", ...TOOL_FLAGS],
      probeRoutes: true,
    });
  });
  after(async () => {
    await c?.close();
  });

  it("the launcher's probe finds the sims' own /v1/responses and /v1/messages", () => {
    for (const r of c.records) {
      assert.ok(r.routes?.includes("/v1/responses"));
      assert.ok(r.routes?.includes("/v1/messages"));
    }
  });
  clientCases(() => ({ url: c.server.url, key: "" }), true);
});

describe("client SDKs through the server, disaggregated (1P1D nixl)", () => {
  let c: PdCluster;
  before(async () => {
    c = await startPdCluster({ kind: "nixl", simArgs: ["--speed", "20", ...TOOL_FLAGS] });
  });
  after(async () => {
    await c?.close();
  });
  clientCases(() => ({ url: c.url, key: "" }));
});
