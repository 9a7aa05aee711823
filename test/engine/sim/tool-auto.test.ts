/**
 * The sim's tool calls for tool_choice "auto" and its tool-call ids, against the engines' source
 * (real sims, the `openai` client; the delta arithmetic alone is in tool-answer.test.ts):
 *
 * - vLLM `--enable-auto-tool-choice --tool-call-parser hermes`: the model writes
 *   `<tool_call>{"name", "arguments"}</tool_call>` and vllm/tool_parsers/hermes_tool_parser.py
 *   @ 02bb669bf661df8b946121215ecb213468247b22 reads it. Streamed (extract_tool_calls_streaming):
 *   the first delta of a call is `DeltaToolCall(index, type="function", id=make_tool_call_id(),
 *   function=DeltaFunctionCall(name=name).model_dump(exclude_none=True))` — a name and no
 *   arguments key — and the later ones `DeltaToolCall(index, function={arguments: diff})`, with
 *   no id, type or name; the tags are held back, never content. Whole (extract_tool_calls):
 *   `content` = the text before `<tool_call>` or None; vllm/entrypoints/openai/chat_completion/
 *   serving.py @ 5e918640d7b65820db5beaa98c2a99925bff7c17 sets finish_reason "tool_calls" when
 *   the parser found calls (auto_tools_called). The required choice's shape (an announcement
 *   carrying arguments, then `name: null`) is extract_tool_call_required_streaming's, not this.
 * - vLLM's id: vllm/entrypoints/chat_utils.py make_tool_call_id @
 *   bd5ec6d50b83652c21a570b81c1fb5219a6ebf76, id_type "random": `chatcmpl-tool-{random_uuid()}`
 *   (32 hex digits).
 * - SGLang's id: python/sglang/srt/entrypoints/openai/serving_chat.py `_process_tool_call_id` @
 *   002897c23becbd522d88b8115a763a21765f978a: `call_{uuid.uuid4().hex[:24]}`, except with
 *   `--tool-call-parser kimi_k2`: `functions.{name}:{history_tool_calls_cnt + tool_index}`, the
 *   count of tool_calls in the request's assistant messages (`_get_history_tool_calls_cnt`).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { type SimHandle, startSimEngine } from "../../../src/engine/sim/server.ts";
import { autoBody, MSG, WEATHER } from "./tool-fixtures.ts";

process.env.INFERA_LOG_LEVEL ??= "warn";

function clientOf(sim: SimHandle): OpenAI {
  return new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
}

/** The first seed whose auto answer calls a tool (about half do). */
async function toolSeed(client: OpenAI): Promise<number> {
  for (let seed = 0; seed < 32; seed++) {
    const r = await client.chat.completions.create(autoBody(seed));
    if (r.choices[0].message.tool_calls?.length) return seed;
  }
  assert.fail("no seed in 32 called a tool");
}

describe("vLLM personality, tool_choice auto with the hermes parser", () => {
  let sim: SimHandle;
  let client: OpenAI;
  let seed: number;
  before(async () => {
    sim = await startSimEngine({
      argv: ["--engine", "vllm", "m", "--port", "0", "--host", "127.0.0.1", "--speed", "100"].concat([
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
      ]),
    });
    client = clientOf(sim);
    seed = await toolSeed(client);
  });
  after(async () => sim?.close());

  it("whole: content null (nothing before the call), finish tool_calls, vLLM's id", async () => {
    const r = await client.chat.completions.create(autoBody(seed));
    const c = r.choices[0];
    assert.equal(c.finish_reason, "tool_calls");
    assert.equal(c.message.content, null);
    const call = c.message.tool_calls?.[0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    assert.equal(call.function.name, "get_weather");
    assert.equal(typeof JSON.parse(call.function.arguments).city, "string");
  });

  it("streamed: a name-only announcement, then argument deltas alone; no content", async () => {
    const res = await fetch(`${sim.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...autoBody(seed), stream: true }),
    });
    const text = await res.text();
    const deltas: Record<string, unknown>[] = [];
    let content = "";
    let finish: string | null = null;
    for (const line of text.split("\n")) {
      if (!line.startsWith("data: {")) continue;
      const ch = JSON.parse(line.slice(6)) as {
        choices: {
          delta: { content?: string; tool_calls?: Record<string, unknown>[] };
          finish_reason: string | null;
        }[];
      };
      const choice = ch.choices[0];
      if (!choice) continue;
      content += choice.delta.content ?? "";
      deltas.push(...(choice.delta.tool_calls ?? []));
      finish = choice.finish_reason ?? finish;
    }
    assert.equal(content, "", "the <tool_call> text is never content");
    assert.ok(deltas.length >= 2, text);
    const [first, ...rest] = deltas;
    assert.deepEqual(Object.keys(first).sort(), ["function", "id", "index", "type"]);
    assert.deepEqual(first.function, { name: "get_weather" });
    assert.match(first.id as string, /^chatcmpl-tool-[0-9a-f]{32}$/);
    let args = "";
    for (const d of rest) {
      assert.deepEqual(Object.keys(d).sort(), ["function", "index"]);
      assert.deepEqual(Object.keys(d.function as object), ["arguments"]);
      args += (d.function as { arguments: string }).arguments;
    }
    assert.equal(typeof JSON.parse(args).city, "string");
    assert.equal(finish, "tool_calls");
  });

  it("the openai client's stream helper reassembles the auto call", async () => {
    const final = await client.chat.completions
      .stream({ ...autoBody(seed), stream: true })
      .finalChatCompletion();
    const call = final.choices[0].message.tool_calls?.[0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    assert.equal(call.function.name, "get_weather");
    assert.ok(JSON.parse(call.function.arguments).city);
  });
});

describe("SGLang personality: tool-call ids", () => {
  const sims: SimHandle[] = [];
  const startSglang = async (parser: string) => {
    const sim = await startSimEngine({
      argv: ["--engine", "sglang", "--model-path", "m", "--port", "0", "--speed", "100"].concat([
        "--tool-call-parser",
        parser,
      ]),
    });
    sims.push(sim);
    return clientOf(sim);
  };
  after(async () => {
    for (const s of sims) await s.close();
  });

  const required = { model: "m", messages: MSG, tools: [WEATHER], tool_choice: "required" } as const;

  it("call_ + 24 hex digits by default", async () => {
    const client = await startSglang("qwen25");
    const r = await client.chat.completions.create({ ...required, tools: [WEATHER] });
    assert.match(r.choices[0].message.tool_calls?.[0]?.id ?? "", /^call_[0-9a-f]{24}$/);
  });

  it("kimi_k2: functions.{name}:{earlier tool calls + index}", async () => {
    const client = await startSglang("kimi_k2");
    const first = await client.chat.completions.create({ ...required, tools: [WEATHER] });
    assert.equal(first.choices[0].message.tool_calls?.[0]?.id, "functions.get_weather:0");
    const earlier = (id: string): OpenAI.ChatCompletionMessageParam => ({
      role: "assistant",
      content: null,
      tool_calls: [{ id, type: "function", function: { name: "get_weather", arguments: "{}" } }],
    });
    const r = await client.chat.completions.create({
      model: "m",
      messages: [
        ...MSG,
        earlier("functions.get_weather:0"),
        { role: "tool", tool_call_id: "functions.get_weather:0", content: "sunny" },
        earlier("functions.get_weather:1"),
        { role: "tool", tool_call_id: "functions.get_weather:1", content: "rain" },
      ],
      tools: [WEATHER],
      tool_choice: { type: "function", function: { name: "get_weather" } },
    });
    assert.equal(r.choices[0].message.tool_calls?.[0]?.id, "functions.get_weather:2");
  });
});
