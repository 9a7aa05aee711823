/**
 * The sim answers tools, structured outputs and sampling fields as vLLM does, checked with the
 * official `openai` client's own parsers (zodResponseFormat + .parse(), runTools, streamed
 * tool-call deltas). Sources, vllm-project/vllm:
 * - vllm/entrypoints/openai/chat_completion/serving.py @ 5e918640d7b65820db5beaa98c2a99925bff7c17:
 *   tool_choice refusals without a tool parser (render_chat_request); named / required tool
 *   calls whole (chat_completion_full_generator: content "", finish_reason "tool_calls" for
 *   required, the output's for named) and streamed (first delta id + type + name, then
 *   argument deltas; extract_tool_call_required_streaming); stop_reason = output.stop_reason;
 *   continuous usage on every chunk, the role chunk with completion_tokens 0.
 * - vllm/sampling_params.py @ 00388f6573ccfcffad607b8c9ecdf341a4669ceb _verify_args:
 *   "temperature must be non-negative, got -1.0."; greedy below 1e-5.
 * - vllm/v1/engine/input_processor.py @ 009daaeebfb0ce2813f970f2173ea9c8eee09092: `priority` is
 *   not checked (v0's "Priority scheduling is not enabled" 400 is gone); FCFS ignores it.
 * SGLang: python/sglang/srt/entrypoints/openai/serving_chat.py @ 002897c23becbd522d88b8115a763a21765f978a
 * refuses no tool_choice for want of --tool-call-parser.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { OutputVocab } from "../../../src/engine/sim/output.ts";
import { type SimHandle, startSimEngine } from "../../../src/engine/sim/server.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { autoBody, MSG, WEATHER } from "./tool-fixtures.ts";

process.env.INFERA_LOG_LEVEL ??= "warn";

async function start(argv: string[]): Promise<{ sim: SimHandle; client: OpenAI }> {
  const sim = await startSimEngine({
    argv: ["--engine", "vllm", "m", "--port", "0", "--host", "127.0.0.1", "--speed", "100", ...argv],
  });
  return { sim, client: new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 }) };
}

async function status400(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof OpenAI.BadRequestError, String(err));
    return err.message;
  }
  assert.fail("expected a 400");
}

describe("sim answers like vLLM: plain server (no tool flags)", () => {
  let sim: SimHandle;
  let client: OpenAI;
  before(async () => ({ sim, client } = await start([])));
  after(async () => sim?.close());

  it("refuses tool_choice auto (and tools alone) without --enable-auto-tool-choice", async () => {
    const want = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set';
    assert.match(
      await status400(
        client.chat.completions.create({ model: "m", messages: MSG, tools: [WEATHER], tool_choice: "auto" }),
      ),
      new RegExp(want.replaceAll("-", "\\-")),
    );
    assert.match(
      await status400(client.chat.completions.create({ model: "m", messages: MSG, tools: [WEATHER] })),
      /"auto" tool choice requires/,
    );
  });

  it("refuses required without --tool-call-parser", async () => {
    const msg = await status400(
      client.chat.completions.create({
        model: "m",
        messages: MSG,
        tools: [WEATHER],
        tool_choice: "required",
      }),
    );
    assert.match(msg, /tool_choice="required" requires --tool-call-parser to be set/);
  });

  it("response_format json_schema: .parse() with a zod schema succeeds", async () => {
    const Answer = z.object({
      city: z.string(),
      temps: z.array(z.number()),
      sunny: z.boolean(),
      kind: z.enum(["rain", "snow", "sun"]),
      where: z.object({ lat: z.number(), lon: z.number() }),
      note: z.string().nullable(),
    });
    const r = await client.chat.completions.parse({
      model: "m",
      messages: MSG,
      response_format: zodResponseFormat(Answer, "answer"),
    });
    const parsed = r.choices[0].message.parsed;
    assert.ok(parsed);
    assert.deepEqual(Answer.parse(parsed), parsed);
    assert.equal(r.choices[0].finish_reason, "stop");
  });

  it("json_object and vLLM's structured_outputs.json give JSON; a short max_tokens cuts it (length)", async () => {
    const r = await client.chat.completions.create({
      model: "m",
      messages: MSG,
      response_format: { type: "json_object" },
    });
    assert.equal(typeof JSON.parse(r.choices[0].message.content ?? ""), "object");
    const schema = {
      type: "object",
      properties: { n: { type: "integer", minimum: 3, maximum: 3 } },
      required: ["n"],
    };
    const body = {
      model: "m",
      messages: MSG,
      structured_outputs: { json: schema },
    } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming;
    const s = await client.chat.completions.create(body);
    assert.deepEqual(JSON.parse(s.choices[0].message.content ?? ""), { n: 3 });
    const cut = await client.chat.completions.create({ ...body, max_tokens: 2 });
    assert.equal(cut.choices[0].finish_reason, "length");
  });

  it("temperature 0 is greedy: the same request gives the same text; others differ", async () => {
    const ask = (temperature?: number) =>
      client.chat.completions.create({
        model: "m",
        messages: MSG,
        max_tokens: 12,
        ...(temperature === undefined ? {} : { temperature }),
      });
    const [a, b] = await Promise.all([ask(0), ask(0)]);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    const [c, d] = await Promise.all([ask(), ask()]);
    assert.notEqual(c.choices[0].message.content, d.choices[0].message.content);
  });

  it("temperature < 0 gets vLLM's 400", async () => {
    const msg = await status400(
      client.chat.completions.create({ model: "m", messages: MSG, temperature: -1 }),
    );
    assert.match(msg, /temperature must be non-negative, got -1\.0\./);
  });

  it("stop_reason carries the matched stop string; null otherwise", async () => {
    const free = await client.completions.create({ model: "m", prompt: "x", max_tokens: 40, temperature: 0 });
    const text = free.choices[0].text;
    const word = text.trim().split(/\s+/)[2];
    const r = await client.completions.create({
      model: "m",
      prompt: "x",
      max_tokens: 40,
      temperature: 0,
      stop: [word],
    });
    const c = r.choices[0] as OpenAI.CompletionChoice & { stop_reason?: unknown };
    assert.equal(c.finish_reason, "stop");
    assert.equal(c.stop_reason, word);
    assert.equal((free.choices[0] as { stop_reason?: unknown }).stop_reason, null);
  });

  it("stop_reason carries the stop token id that ended the text (its text left out)", async () => {
    // Every id the sim's vocabulary can draw (the default tokenizer's): the first token stops.
    const ids = Array.from(OutputVocab.build(getDefaultTokenizer()).ids);
    const r = await client.chat.completions.create({
      model: "m",
      messages: MSG,
      max_tokens: 10,
      stop_token_ids: ids,
    } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const c = r.choices[0] as OpenAI.ChatCompletion.Choice & { stop_reason?: unknown };
    assert.equal(c.finish_reason, "stop");
    assert.ok(ids.includes(c.stop_reason as number));
    assert.equal(c.message.content, "");
    assert.equal(r.usage?.completion_tokens, 1);
  });

  it("continuous_usage_stats: usage on every chunk, counting up", async () => {
    const stream = await client.chat.completions.create({
      model: "m",
      messages: MSG,
      max_tokens: 6,
      stream: true,
      stream_options: {
        include_usage: true,
        continuous_usage_stats: true,
      } as OpenAI.ChatCompletionStreamOptions,
    });
    const seen: number[] = [];
    let chunks = 0;
    for await (const ch of stream) {
      chunks++;
      assert.ok(ch.usage, "every chunk carries usage");
      seen.push(ch.usage.completion_tokens);
    }
    assert.ok(chunks >= 3);
    assert.equal(seen[0], 0);
    assert.equal(seen[seen.length - 1], 6);
    assert.deepEqual(
      seen,
      [...seen].sort((x, y) => x - y),
    );
  });

  it("priority is accepted without --scheduling-policy priority (v1 checks nothing)", async () => {
    const body = {
      model: "m",
      messages: MSG,
      priority: 5,
    } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming;
    const r = await client.chat.completions.create({ ...body, max_tokens: 3 });
    assert.equal(r.choices[0].finish_reason, "length");
  });
});

describe("sim answers like vLLM: --enable-auto-tool-choice --tool-call-parser hermes", () => {
  let sim: SimHandle;
  let client: OpenAI;
  before(
    async () =>
      ({ sim, client } = await start(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])),
  );
  after(async () => sim?.close());

  it("required: a tool call in vLLM's shape, arguments valid for the schema", async () => {
    const r = await client.chat.completions.create({
      model: "m",
      messages: MSG,
      tools: [WEATHER],
      tool_choice: "required",
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, "tool_calls");
    assert.equal(c.message.content, "");
    const call = c.message.tool_calls?.[0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    assert.equal(call.function.name, "get_weather");
    const args = JSON.parse(call.function.arguments);
    assert.equal(typeof args.city, "string");
    assert.ok(["c", "f"].includes(args.unit));
    assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7);
  });

  it("named tool, streamed: first delta has id and name, argument deltas reassemble; finish stop", async () => {
    const stream = await client.chat.completions.create({
      model: "m",
      messages: MSG,
      tools: [WEATHER],
      tool_choice: { type: "function", function: { name: "get_weather" } },
      stream: true,
    });
    let args = "";
    let deltas = 0;
    let finish: string | null = null;
    const all: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
    for await (const ch of stream) {
      for (const tc of ch.choices[0]?.delta.tool_calls ?? []) {
        all.push(tc);
        deltas++;
        args += tc.function?.arguments ?? "";
      }
      finish = ch.choices[0]?.finish_reason ?? finish;
    }
    assert.ok(all[0].id?.startsWith("chatcmpl-tool-"));
    assert.equal(all[0].function?.name, "get_weather");
    // vLLM's later deltas carry the arguments alone (no id, no name).
    for (const d of all.slice(1)) assert.deepEqual(Object.keys(d).sort(), ["function", "index"]);
    assert.ok(deltas >= 1);
    assert.equal(typeof JSON.parse(args).city, "string");
    assert.equal(finish, "stop");
  });

  it("required, streamed: the client's stream helper reassembles the call", async () => {
    const runner = client.chat.completions.stream({
      model: "m",
      messages: MSG,
      tools: [WEATHER],
      tool_choice: "required",
    });
    const final = await runner.finalChatCompletion();
    const call = final.choices[0].message.tool_calls?.[0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    assert.equal(final.choices[0].finish_reason, "tool_calls");
    assert.equal(call.function.name, "get_weather");
    assert.ok(JSON.parse(call.function.arguments).city);
  });

  it("runTools with tool_choice required completes, calling the tool each round", async () => {
    let calls = 0;
    const runner = client.chat.completions.runTools(
      {
        model: "m",
        messages: MSG,
        tool_choice: "required",
        tools: [
          {
            type: "function",
            function: {
              name: "get_weather",
              description: "The weather in a city",
              parameters: WEATHER.function.parameters as Record<string, unknown>,
              parse: JSON.parse,
              function: (a: { city: string }) => {
                calls++;
                return `sunny in ${a.city}`;
              },
            },
          },
        ],
      },
      { maxChatCompletions: 3 },
    );
    await runner.done();
    assert.equal(calls, 3);
  });

  it("auto: seeded, sometimes a tool call (finish tool_calls), sometimes text", async () => {
    const kinds = new Set<string>();
    const kind = async (seed: number) => {
      const r = await client.chat.completions.create(autoBody(seed));
      const c = r.choices[0];
      if (c.message.tool_calls?.length) assert.equal(c.finish_reason, "tool_calls");
      return c.message.tool_calls?.length ? "tool" : "text";
    };
    for (let seed = 0; seed < 16 && kinds.size < 2; seed++) {
      const k = await kind(seed);
      assert.equal(await kind(seed), k, "the same seed decides the same way");
      kinds.add(k);
    }
    assert.deepEqual([...kinds].sort(), ["text", "tool"]);
  });
});

describe("sim priority under --scheduling-policy priority", () => {
  it("accepts priority and admits lower values first", async () => {
    // A long first request holds the one slot until the other three wait behind it; once it is
    // cancelled they are admitted lowest priority value first, whatever their arrival order.
    // Long enough (~90 s at --speed 1) that it cannot end before the three queue. On a fresh
    // CI clone the hold request's connection was sometimes closed under it ("other side
    // closed", UND_ERR_SOCKET, cause not found yet: see the session note); a scenario whose hold
    // failed proves nothing, so it is run again on a fresh sim (at most 3 times).
    let lastHoldError = "";
    for (let attempt = 0; attempt < 3; attempt++) {
      const { sim, client } = await start([
        "--scheduling-policy",
        "priority",
        "--max-num-seqs",
        "1",
        "--max-model-len",
        "40000",
        "--speed",
        "1",
      ]);
      try {
        const order: number[] = [];
        const ask = (priority: number, max_tokens: number, signal?: AbortSignal) =>
          client.chat.completions
            .create(
              {
                model: "m",
                messages: MSG,
                max_tokens,
                priority,
              } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming,
              { signal },
            )
            .then(() => order.push(priority));
        const hold = new AbortController();
        let holdFailed = false;
        const holdBy = Date.now() + 20_000;
        const first = ask(0, 30_000, hold.signal).catch((e: unknown) => {
          if (!hold.signal.aborted) {
            holdFailed = true;
            lastHoldError = String((e as { cause?: unknown }).cause ?? e);
          }
        });
        // The hold must be running before the others arrive: sent in the same tick, all four
        // could reach the waiting queue before the first step (seen: 4 waiting, -3 admitted first).
        while (sim.engine.scheduler.running.length === 0 && !holdFailed && Date.now() < holdBy)
          await new Promise((r) => setTimeout(r, 2));
        if (holdFailed) continue;
        const rest = [ask(9, 2), ask(5, 2), ask(-3, 2)];
        const deadline = Date.now() + 20_000;
        while (sim.engine.scheduler.waiting.length < 3 && !holdFailed && Date.now() < deadline)
          await new Promise((r) => setTimeout(r, 5));
        if (holdFailed) {
          hold.abort();
          continue;
        }
        assert.equal(sim.engine.scheduler.waiting.length, 3);
        hold.abort();
        await Promise.all([first, ...rest]);
        assert.deepEqual(order, [-3, 5, 9]);
        return;
      } finally {
        await sim.close();
      }
    }
    assert.fail(`the hold request failed on every attempt: ${lastHoldError}`);
  });
});

describe("sim answers like SGLang: no refusal without --tool-call-parser", () => {
  let sim: SimHandle;
  let client: OpenAI;
  before(async () => {
    sim = await startSimEngine({
      argv: ["--engine", "sglang", "--model-path", "m", "--port", "0", "--speed", "100"],
    });
    client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
  });
  after(async () => sim?.close());

  it("auto without a parser: plain text; required: a tool call from the JSON-schema fallback", async () => {
    const auto = await client.chat.completions.create({
      model: "m",
      messages: MSG,
      tools: [WEATHER],
      max_tokens: 5,
    });
    assert.deepEqual(auto.choices[0].message.tool_calls ?? [], []);
    assert.ok((auto.choices[0].message.content ?? "").length > 0);
    const req = await client.chat.completions.create({
      model: "m",
      messages: MSG,
      tools: [WEATHER],
      tool_choice: "required",
    });
    const call = req.choices[0].message.tool_calls?.[0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    assert.equal(call.function.name, "get_weather");
    assert.equal(typeof JSON.parse(call.function.arguments).city, "string");
  });

  // python/sglang/srt/sampling/sampling_params.py @ 00c17cafcb9e289d5ca97c50e44ada54e4fd5b03 verify().
  it("temperature < 0 gets SGLang's own message", async () => {
    const msg = await status400(
      client.chat.completions.create({ model: "m", messages: MSG, temperature: -1 }),
    );
    assert.match(msg, /temperature must be a non-negative finite number, got -1\.0\./);
  });
});
