/**
 * What the translations send to the engine and make of its answer, tool calls included, read
 * with the SDKs' own parsers. The engine here is a stand-in that records the chat body and
 * answers chat chunks in vLLM's streamed tool-call shape — the first delta of a call carries
 * `id`, `type: "function"`, `index` and `function.name`, later ones `function.arguments` pieces
 * (vllm-project/vllm vllm/entrypoints/openai/chat_completion/serving.py @
 * c0bc59655a4068c08621bcac8ab67b39cd2ec173, `DeltaToolCall` / `DeltaFunctionCall`), finish
 * `tool_calls`, and `stop_reason` with the matched stop string (vLLM's `stop_reason`). These cases
 * pin the translation itself, with exact chunks; clients.test.ts runs the SDKs against sims.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { type InferaServer, startServer } from "../../../src/server/index.ts";
import { mixedRecord } from "../../helpers/records.ts";

const MODEL = "tool-model";

type Obj = Record<string, unknown>;

/** The answer the stand-in gives next: chunks (streamed) or the whole message. */
interface Script {
  text?: string;
  calls?: Array<{ id: string; name: string; args: string[] }>;
  finish: string;
  stopReason?: string | null;
  /** Answer with this status and vLLM's error body instead. */
  errorStatus?: number;
}

function chunk(delta: Obj, finish: string | null = null, stopReason: string | null = null): string {
  const c = { id: "chatcmpl-1", object: "chat.completion.chunk", created: 1, model: MODEL };
  return `data: ${JSON.stringify({ ...c, choices: [{ index: 0, delta, finish_reason: finish, stop_reason: stopReason }] })}\n\n`;
}

async function engine(): Promise<{ server: Server; url: string; bodies: Obj[]; next: (s: Script) => void }> {
  const bodies: Obj[] = [];
  let script: Script = { text: "hi", finish: "stop" };
  const server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (c: Buffer) => parts.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(parts).toString()) as Obj;
      bodies.push(body);
      const s = script;
      const usage = { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18 };
      if (s.errorStatus) {
        // vLLM's ErrorResponse (vllm/entrypoints/openai/engine/protocol.py): {"error": {message, type, param, code}}.
        res.writeHead(s.errorStatus, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            error: {
              message: "temperature must be non-negative",
              type: "BadRequestError",
              param: null,
              code: 400,
            },
          }),
        );
        return;
      }
      if (body.stream !== true) {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            id: "chatcmpl-1",
            object: "chat.completion",
            model: MODEL,
            choices: [
              {
                index: 0,
                message: {
                  role: "assistant",
                  content: s.text ?? null,
                  tool_calls: (s.calls ?? []).map((c) => ({
                    id: c.id,
                    type: "function",
                    function: { name: c.name, arguments: c.args.join("") },
                  })),
                },
                finish_reason: s.finish,
                stop_reason: s.stopReason ?? null,
              },
            ],
            usage,
          }),
        );
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      let out = chunk({ role: "assistant", content: "" });
      for (const piece of (s.text ?? "").match(/.{1,3}/g) ?? []) out += chunk({ content: piece });
      (s.calls ?? []).forEach((c, index) => {
        out += chunk({ tool_calls: [{ id: c.id, type: "function", index, function: { name: c.name } }] });
        for (const a of c.args) out += chunk({ tool_calls: [{ index, function: { arguments: a } }] });
      });
      out += chunk({}, s.finish, s.stopReason ?? null);
      out += `data: ${JSON.stringify({ id: "chatcmpl-1", object: "chat.completion.chunk", model: MODEL, choices: [], usage })}\n\n`;
      res.end(`${out}data: [DONE]\n\n`);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    server,
    url,
    bodies,
    next: (s) => {
      script = s;
    },
  };
}

const WEATHER = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };

describe("translation to and from chat (engine stand-in with tool calls)", () => {
  let e: Awaited<ReturnType<typeof engine>>;
  let server: InferaServer;
  let openai: OpenAI;
  let anthropic: Anthropic;
  before(async () => {
    e = await engine();
    const memory = new MemoryDiscovery([mixedRecord({ id: "w0", model: MODEL, url: e.url, engine: "vllm" })]);
    server = await startServer(
      { port: 0, scrapeIntervalMs: 0, maxBodyBytes: 256 * 1024 },
      { discovery: memory },
    );
    openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
    anthropic = new Anthropic({ baseURL: server.url, apiKey: "none", maxRetries: 0 });
  });
  after(async () => {
    await server?.close();
    await new Promise((r) => e?.server.close(r));
  });

  it("responses → chat: instructions, items, function calls and outputs, tools, format", async () => {
    e.next({ text: "ok", finish: "stop" });
    e.bodies.length = 0;
    await openai.responses.create({
      model: MODEL,
      instructions: "sys",
      input: [
        { role: "developer", content: "dev" },
        {
          role: "user",
          content: [
            { type: "input_text", text: "look" },
            { type: "input_image", image_url: "data:image/png;base64,AAAA", detail: "low" },
          ],
        },
        { type: "function_call", call_id: "c1", name: "get_weather", arguments: '{"city":"Paris"}' },
        { type: "function_call", call_id: "c2", name: "get_weather", arguments: '{"city":"Rome"}' },
        { type: "function_call_output", call_id: "c1", output: "sunny" },
        { type: "function_call_output", call_id: "c2", output: "rain" },
      ],
      tools: [{ type: "function", name: "get_weather", parameters: WEATHER, strict: true }],
      tool_choice: { type: "function", name: "get_weather" },
      text: { format: { type: "json_schema", name: "w", schema: WEATHER, strict: true } },
      max_output_tokens: 20,
      temperature: 0,
    });
    const b = e.bodies[0]!;
    assert.deepEqual(b.messages, [
      { role: "system", content: "sys" },
      { role: "system", content: "dev" },
      {
        role: "user",
        content: [
          { type: "text", text: "look" },
          { type: "image_url", image_url: { url: "data:image/png;base64,AAAA", detail: "low" } },
        ],
      },
      {
        role: "assistant",
        content: null,
        tool_calls: [
          { id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } },
          { id: "c2", type: "function", function: { name: "get_weather", arguments: '{"city":"Rome"}' } },
        ],
      },
      { role: "tool", tool_call_id: "c1", content: "sunny" },
      { role: "tool", tool_call_id: "c2", content: "rain" },
    ]);
    assert.deepEqual(b.tools, [
      { type: "function", function: { name: "get_weather", parameters: WEATHER, strict: true } },
    ]);
    assert.deepEqual(b.tool_choice, { type: "function", function: { name: "get_weather" } });
    assert.deepEqual(b.response_format, {
      type: "json_schema",
      json_schema: { name: "w", schema: WEATHER, strict: true },
    });
    assert.equal(b.max_tokens, 20);
    assert.equal(b.temperature, 0);
  });

  it("responses: a streamed tool call, accumulated by the SDK's ResponseStream", async () => {
    e.next({
      calls: [{ id: "call_9", name: "get_weather", args: ['{"ci', 'ty":', '"Paris"}'] }],
      finish: "tool_calls",
    });
    const s = openai.responses.stream({
      model: MODEL,
      input: "weather?",
      tools: [{ type: "function", name: "get_weather", parameters: WEATHER, strict: true }],
      tool_choice: "required",
    });
    const deltas: string[] = [];
    s.on("response.function_call_arguments.delta", (ev) => deltas.push(ev.delta));
    const final = await s.finalResponse();
    assert.deepEqual(deltas, ['{"ci', 'ty":', '"Paris"}']);
    assert.equal(final.status, "completed");
    const call = final.output.find((o) => o.type === "function_call");
    assert.ok(call && call.type === "function_call");
    assert.equal(call.call_id, "call_9");
    assert.equal(call.name, "get_weather");
    assert.equal(call.arguments, '{"city":"Paris"}');
    assert.equal(final.usage?.input_tokens, 11);
  });

  it("responses: text then a call, whole", async () => {
    e.next({
      text: "let me check",
      calls: [{ id: "call_1", name: "get_weather", args: ["{}"] }],
      finish: "tool_calls",
    });
    const r = await openai.responses.create({ model: MODEL, input: "weather?" });
    assert.deepEqual(
      r.output.map((o) => o.type),
      ["message", "function_call"],
    );
    assert.equal(r.output_text, "let me check");
  });

  it("messages → chat: system blocks, images, tool_use / tool_result, tools, tool_choice, stops", async () => {
    e.next({ text: "ok", finish: "stop" });
    e.bodies.length = 0;
    await anthropic.messages.create({
      model: MODEL,
      max_tokens: 30,
      system: [{ type: "text", text: "sys" }],
      stop_sequences: ["END"],
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "look" },
            { type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } },
          ],
        },
        {
          role: "assistant",
          content: [
            { type: "text", text: "checking" },
            { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } },
          ],
        },
        {
          role: "user",
          content: [
            { type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "sunny" }] },
            { type: "text", text: "and?" },
          ],
        },
      ],
      tools: [{ name: "get_weather", description: "w", input_schema: WEATHER as Anthropic.Tool.InputSchema }],
      tool_choice: { type: "any", disable_parallel_tool_use: true },
    });
    const b = e.bodies[0]!;
    assert.deepEqual(b.messages, [
      { role: "system", content: "sys" },
      {
        role: "user",
        content: [
          { type: "text", text: "look" },
          { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } },
        ],
      },
      {
        role: "assistant",
        content: "checking",
        tool_calls: [
          {
            id: "toolu_1",
            type: "function",
            function: { name: "get_weather", arguments: '{"city":"Paris"}' },
          },
        ],
      },
      { role: "tool", tool_call_id: "toolu_1", content: "sunny" },
      { role: "user", content: [{ type: "text", text: "and?" }] },
    ]);
    assert.deepEqual(b.tools, [
      { type: "function", function: { name: "get_weather", parameters: WEATHER, description: "w" } },
    ]);
    assert.equal(b.tool_choice, "required");
    assert.equal(b.parallel_tool_calls, false);
    assert.deepEqual(b.stop, ["END"]);
    assert.equal(b.max_tokens, 30);
  });

  it("messages: a streamed tool call, accumulated by the SDK's MessageStream", async () => {
    e.next({
      text: "checking",
      calls: [{ id: "call_7", name: "get_weather", args: ['{"city"', ':"Rome"}'] }],
      finish: "tool_calls",
    });
    const s = anthropic.messages.stream({
      model: MODEL,
      max_tokens: 50,
      messages: [{ role: "user", content: "weather?" }],
      tools: [{ name: "get_weather", input_schema: WEATHER as Anthropic.Tool.InputSchema }],
    });
    const json: string[] = [];
    s.on("inputJson", (partial) => json.push(partial));
    const m = await s.finalMessage();
    assert.equal(m.stop_reason, "tool_use");
    assert.deepEqual(json, ['{"city"', ':"Rome"}']);
    assert.equal(m.content[0]?.type === "text" && m.content[0].text, "checking");
    const tool = m.content[1];
    assert.ok(tool?.type === "tool_use");
    assert.deepEqual([tool.id, tool.name, tool.input], ["call_7", "get_weather", { city: "Rome" }]);
    assert.deepEqual([m.usage.input_tokens, m.usage.output_tokens], [11, 7]);
  });

  it("messages: a matched stop sequence is stop_sequence (vLLM's stop_reason), whole and streamed", async () => {
    e.next({ text: "abc", finish: "stop", stopReason: "END" });
    const req = {
      model: MODEL,
      max_tokens: 10,
      stop_sequences: ["END"],
      messages: [{ role: "user" as const, content: "x" }],
    };
    const m = await anthropic.messages.create(req);
    assert.deepEqual([m.stop_reason, m.stop_sequence], ["stop_sequence", "END"]);
    const f = await anthropic.messages.stream(req).finalMessage();
    assert.deepEqual([f.stop_reason, f.stop_sequence], ["stop_sequence", "END"]);
  });

  it("an engine's error comes back in each API's own shape, its message kept", async () => {
    e.next({ finish: "stop", errorStatus: 400 });
    const ask = { model: MODEL, max_tokens: 5, messages: [{ role: "user" as const, content: "x" }] };
    await assert.rejects(
      anthropic.messages.create(ask),
      (err: unknown) =>
        err instanceof Anthropic.BadRequestError &&
        (err.error as { type?: string }).type === "error" &&
        (err.error as { error?: { type?: string; message?: string } }).error?.message ===
          "temperature must be non-negative",
    );
    await assert.rejects(
      openai.responses.create({ model: MODEL, input: "x" }),
      (err: unknown) =>
        err instanceof OpenAI.BadRequestError && err.message.includes("temperature must be non-negative"),
    );
    e.next({ text: "ok", finish: "stop" });
  });

  it("a body over the size limit is a 413 in Anthropic's shape", async () => {
    const r = await fetch(`${server.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        max_tokens: 1,
        messages: [{ role: "user", content: "x".repeat(300_000) }],
      }),
    });
    assert.equal(r.status, 413);
    const b = (await r.json()) as { type: string; error: { type: string } };
    assert.deepEqual([b.type, b.error.type], ["error", "request_too_large"]);
  });

  it("input the translation cannot carry is a 400 in each API's own shape", async () => {
    await assert.rejects(
      openai.responses.create({ model: MODEL, input: [{ type: "web_search_call" } as never] }),
      (err: unknown) =>
        err instanceof OpenAI.BadRequestError && (err.error as { param?: string }).param === "input[0].type",
    );
    await assert.rejects(
      anthropic.messages.create({
        model: MODEL,
        max_tokens: 5,
        messages: [
          {
            role: "user",
            content: [{ type: "document", source: { type: "text", data: "x", media_type: "text/plain" } }],
          },
        ],
      }),
      (err: unknown) =>
        err instanceof Anthropic.BadRequestError &&
        (err.error as { error?: { type?: string } }).error?.type === "invalid_request_error",
    );
  });
});
