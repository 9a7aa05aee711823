/**
 * What a request asks the sim to "decode" beyond free text, checked as the personality's engine
 * checks it (personalities/*.ts `requests`): tools and tool_choice, structured outputs
 * (response_format and the engine's own guided fields), greedy temperature 0, priority, stop
 * token ids, continuous usage. planAnswer() refuses what the engine refuses; scriptFor() writes,
 * per choice and from its seeded Mulberry32, the text the engine's constrained decoding would produce.
 */
import { randomUUID } from "node:crypto";
import { BadRequestError } from "../../protocol/errors.ts";
import type { Mulberry32 } from "../../util/mulberry32.ts";
import type { SimConfig } from "./config.ts";
import { generateFromSchema, pyJson } from "./json-gen.ts";

type Obj = Record<string, unknown>;

export type ToolChoice =
  | { kind: "none" }
  | { kind: "auto" }
  | { kind: "required" }
  | { kind: "named"; name: string; repr: string };

export interface ToolDef {
  name: string;
  parameters: unknown;
}

/** What an engine may build a tool call's id from. */
export interface ToolCallSlot {
  /** The function called. */
  name: string;
  /** The call's position in this answer. */
  index: number;
  /** Tool calls in the request's earlier assistant messages. */
  history: number;
  /** `--tool-call-parser`, when set. */
  parser: string | undefined;
}

/** The engine's request rules, one object per personality. */
export interface RequestRules {
  /** Whether the engine reads `tools` / `tool_choice` at all. */
  readonly tools: boolean;
  /** The refusal of a tool_choice the server was not started for, or null. */
  toolChoiceRefusal(choice: ToolChoice, cfg: SimConfig): string | null;
  /** With tool_choice auto: whether the server's tool parser is on (the sim then sometimes calls a tool). */
  autoToolCalls(cfg: SimConfig): boolean;
  /** A new tool call's id, as the engine makes it. */
  newToolCallId(call: ToolCallSlot): string;
  /** Structured-output fields honoured: response_format; vLLM's structured_outputs / guided_*; SGLang's json_schema. */
  readonly structured: { responseFormat: boolean; vllmFields: boolean; sglangFields: boolean };
  /** Temperature checks (`negative`: the words before ", got -1.0."; max null: no upper bound); null: not checked. */
  readonly temperature: { negative: string; max: number | null; greedyNeedsN1: boolean } | null;
  /** `priority`: honoured (true), ignored (false), or refused (the message). */
  priority(p: number, cfg: SimConfig): boolean | string;
}

/** One choice's tool-call layout in its scripted text (tool-answer.ts turns it into the wire shape). */
export type ChoiceShape =
  | { kind: "named"; name: string; id: string }
  | { kind: "calls"; calls: { name: string; id: string; start: number; end: number }[] }
  /** Auto: calls in the tool parser's own format (Hermes), `nameEnd` just past the name's closing quote. */
  | { kind: "parsed"; calls: { name: string; id: string; nameEnd: number; start: number; end: number }[] };

export interface AnswerPlan {
  tools: ToolDef[];
  choice: ToolChoice;
  autoCalls: boolean;
  /** Tool calls in the request's earlier assistant messages (SGLang's kimi_k2 ids count on). */
  toolHistory: number;
  /** The server's `--tool-call-parser`, when set. */
  toolCallParser: string | undefined;
  /** Structured-output schema (json_object: {}), or a fixed choice list, or null for free text. */
  schema: unknown;
  choices: string[] | null;
  greedy: boolean;
  priority: number;
  continuousUsage: boolean;
  stopTokenIds: number[];
}

/** Python's repr of a float, as the engines' f-strings print it (-1 → "-1.0"). */
export function pyFloat(n: number): string {
  return Number.isInteger(n) ? n.toFixed(1) : String(n);
}

function obj(v: unknown): Obj | null {
  return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Obj) : null;
}

function parseTools(body: Obj): ToolDef[] {
  if (!Array.isArray(body.tools)) return [];
  return body.tools.map((t, i) => {
    const fn = obj(obj(t)?.function);
    if (!fn || typeof fn.name !== "string")
      throw new BadRequestError(`tools[${i}].function.name is required`, "tools");
    return { name: fn.name, parameters: fn.parameters ?? { type: "object", properties: {} } };
  });
}

/**
 * vLLM's ChatCompletionRequest defaults tool_choice to "auto" when tools are given and none is
 * named (vllm/entrypoints/openai/chat_completion/protocol.py check_tool_usage).
 */
function parseToolChoice(body: Obj, tools: ToolDef[]): ToolChoice {
  const tc = body.tool_choice;
  if (tc === undefined || tc === null) return tools.length > 0 ? { kind: "auto" } : { kind: "none" };
  if (tc === "none" || tc === "auto" || tc === "required") {
    if (tc !== "none" && tools.length === 0)
      throw new BadRequestError("When using `tool_choice`, `tools` must be set.", "tool_choice");
    return { kind: tc };
  }
  const name = obj(obj(tc)?.function)?.name;
  if (typeof name !== "string" || name.length === 0)
    throw new BadRequestError(
      'Invalid value for `tool_choice`. Correct usage: `{"type": "function", "function": {"name": "my_function"}}`',
      "tool_choice",
    );
  if (!tools.some((t) => t.name === name))
    throw new BadRequestError(
      "The tool specified in `tool_choice` does not match any of the specified `tools`",
      "tool_choice",
    );
  return {
    kind: "named",
    name,
    repr: `type='function' function=ChatCompletionNamedFunction(name='${name}')`,
  };
}

function parseJsonField(v: unknown, param: string): unknown {
  if (typeof v !== "string") return v;
  try {
    return JSON.parse(v);
  } catch {
    throw new BadRequestError(`'${param}' is not valid JSON`, param);
  }
}

/** The structured-output constraint the request names, if the engine reads that field. */
function parseStructured(body: Obj, rules: RequestRules): { schema: unknown; choices: string[] | null } {
  const s = rules.structured;
  if (s.vllmFields) {
    // vLLM: structured_outputs {json, json_object, choice, regex, grammar}; older guided_json / guided_choice.
    const so = obj(body.structured_outputs);
    if (so?.json !== undefined)
      return { schema: parseJsonField(so.json, "structured_outputs"), choices: null };
    if (so?.json_object === true) return { schema: { type: "object" }, choices: null };
    if (Array.isArray(so?.choice)) return { schema: null, choices: so.choice.map(String) };
    if (body.guided_json !== undefined)
      return { schema: parseJsonField(body.guided_json, "guided_json"), choices: null };
    if (Array.isArray(body.guided_choice)) return { schema: null, choices: body.guided_choice.map(String) };
  }
  if (s.sglangFields && body.json_schema !== undefined)
    return { schema: parseJsonField(body.json_schema, "json_schema"), choices: null };
  const rf = obj(body.response_format);
  if (s.responseFormat && rf) {
    if (rf.type === "json_object") return { schema: { type: "object" }, choices: null };
    if (rf.type === "json_schema") {
      const js = obj(rf.json_schema);
      const schema = js?.schema ?? js?.json_schema;
      if (schema === undefined)
        throw new BadRequestError(
          "schema_ is required for json_schema response format request.",
          "response_format",
        );
      return { schema, choices: null };
    }
  }
  return { schema: null, choices: null };
}

function checkTemperature(body: Obj, rules: RequestRules, n: number): boolean {
  const t = body.temperature;
  if (typeof t !== "number") return false;
  const r = rules.temperature;
  if (r) {
    if (t < 0) throw new BadRequestError(`${r.negative}, got ${pyFloat(t)}.`, "temperature");
    if (r.max !== null && t > r.max)
      throw new BadRequestError(`temperature must be in [0, ${r.max}], got ${pyFloat(t)}.`, "temperature");
    if (t < 1e-5 && r.greedyNeedsN1 && n > 1)
      throw new BadRequestError(`n must be 1 when using greedy sampling, got ${n}.`, "n");
  }
  return t < 1e-5;
}

/** Tool calls in the assistant messages already in the conversation. */
function historyToolCalls(body: Obj): number {
  if (!Array.isArray(body.messages)) return 0;
  let n = 0;
  for (const m of body.messages) {
    const o = obj(m);
    if (o?.role === "assistant" && Array.isArray(o.tool_calls)) n += o.tool_calls.length;
  }
  return n;
}

export function planAnswer(
  kind: "chat" | "completion",
  body: Obj,
  n: number,
  rules: RequestRules,
  cfg: SimConfig,
): AnswerPlan {
  const tools = kind === "chat" && rules.tools ? parseTools(body) : [];
  const choice = kind === "chat" ? parseToolChoice(body, tools) : ({ kind: "none" } as const);
  const refusal = rules.toolChoiceRefusal(choice, cfg);
  if (refusal) throw new BadRequestError(refusal, "tool_choice");
  const greedy = checkTemperature(body, rules, n);
  const p = body.priority;
  if (p !== undefined && p !== null && (typeof p !== "number" || !Number.isInteger(p)))
    throw new BadRequestError("'priority' must be an integer", "priority");
  const prio = typeof p === "number" ? p : 0;
  const ok = prio === 0 ? false : rules.priority(prio, cfg);
  if (typeof ok === "string") throw new BadRequestError(ok, "priority");
  const so = obj(body.stream_options);
  const ids = body.stop_token_ids;
  if (ids !== undefined && ids !== null && !(Array.isArray(ids) && ids.every((x) => Number.isInteger(x))))
    throw new BadRequestError("'stop_token_ids' must be a list of integers", "stop_token_ids");
  return {
    tools,
    choice,
    autoCalls: choice.kind === "auto" && rules.autoToolCalls(cfg),
    toolHistory: kind === "chat" ? historyToolCalls(body) : 0,
    toolCallParser: cfg.toolCallParser,
    ...parseStructured(body, rules),
    greedy,
    priority: ok === true ? prio : 0,
    // vLLM should_include_usage: continuous stats only together with include_usage.
    continuousUsage: so?.include_usage === true && so.continuous_usage_stats === true,
    stopTokenIds: (ids as number[] | undefined) ?? [],
  };
}

/** `[{"name": ..., "parameters": ...}]`, the array vLLM's required-choice schema admits, with the spans of each call's arguments. */
function callsText(calls: { tool: ToolDef; args: unknown; id: string }[]): {
  text: string;
  shape: ChoiceShape;
} {
  let text = "[";
  const spans: { name: string; id: string; start: number; end: number }[] = [];
  calls.forEach((c, k) => {
    if (k > 0) text += ", ";
    text += `{"name": ${JSON.stringify(c.tool.name)}, "parameters": `;
    const args = pyJson(c.args);
    spans.push({ name: c.tool.name, id: c.id, start: text.length, end: text.length + args.length });
    text += `${args}}`;
  });
  return { text: `${text}]`, shape: { kind: "calls", calls: spans } };
}

/**
 * What a model trained on the Hermes tool format writes for an auto call, and what vLLM's
 * `hermes` parser (and SGLang's qwen25 detector) read: `<tool_call>\n{"name": ..., "arguments":
 * ...}\n</tool_call>`, the arguments as Python's json.dumps spaces them.
 */
function hermesText(calls: { tool: ToolDef; args: unknown; id: string }[]): {
  text: string;
  shape: ChoiceShape;
} {
  let text = "";
  const spans: { name: string; id: string; nameEnd: number; start: number; end: number }[] = [];
  calls.forEach((c, k) => {
    if (k > 0) text += "\n";
    text += `<tool_call>\n{"name": ${JSON.stringify(c.tool.name)}`;
    const nameEnd = text.length;
    text += ', "arguments": ';
    const args = pyJson(c.args);
    spans.push({ name: c.tool.name, id: c.id, nameEnd, start: text.length, end: text.length + args.length });
    text += `${args}}\n</tool_call>`;
  });
  return { text, shape: { kind: "parsed", calls: spans } };
}

/** One choice's scripted answer, or null for free text. */
export function scriptFor(
  plan: AnswerPlan,
  rng: Mulberry32,
  rules: RequestRules,
): { text: string; shape: ChoiceShape | null } | null {
  const c = plan.choice;
  const id = (name: string, index: number) =>
    rules.newToolCallId({ name, index, history: plan.toolHistory, parser: plan.toolCallParser });
  if (c.kind === "named") {
    const tool = plan.tools.find((t) => t.name === c.name)!;
    const text = pyJson(generateFromSchema(tool.parameters, rng));
    return { text, shape: { kind: "named", name: c.name, id: id(c.name, 0) } };
  }
  if (c.kind === "required") {
    const tool = plan.tools[Math.floor(rng.next() * plan.tools.length)];
    return callsText([{ tool, args: generateFromSchema(tool.parameters, rng), id: id(tool.name, 0) }]);
  }
  // Auto with a parser on: the seeded draw decides whether this answer calls a tool, written
  // in the parser's format (required's JSON-array shape is vLLM's constrained decoding, not this).
  if (plan.autoCalls && rng.next() < 0.5) {
    const tool = plan.tools[Math.floor(rng.next() * plan.tools.length)];
    return hermesText([{ tool, args: generateFromSchema(tool.parameters, rng), id: id(tool.name, 0) }]);
  }
  if (plan.choices && plan.choices.length > 0)
    return { text: plan.choices[Math.floor(rng.next() * plan.choices.length)], shape: null };
  if (plan.schema !== null) return { text: pyJson(generateFromSchema(plan.schema, rng)), shape: null };
  return null;
}

/**
 * SGLang's tool-call id (python/sglang/srt/entrypoints/openai/serving_chat.py
 * `_process_tool_call_id` @ 002897c23becbd522d88b8115a763a21765f978a): `call_` + the first 24
 * hex digits of a uuid4, except with `--tool-call-parser kimi_k2`, whose model names its calls
 * `functions.{name}:{n}`, n counting the conversation's earlier tool calls plus this call's index.
 */
export function sglangToolCallId(call: ToolCallSlot): string {
  if (call.parser === "kimi_k2") return `functions.${call.name}:${call.history + call.index}`;
  return `call_${randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

/**
 * vLLM's random tool-call id (vllm/entrypoints/chat_utils.py make_tool_call_id, id_type
 * "random": `chatcmpl-tool-` + uuid4 hex). vLLM's other id_type, kimi_k2, follows the model's
 * HF config (model_type kimi_*), which the sim does not have.
 */
export function vllmToolCallId(): string {
  return `chatcmpl-tool-${randomUUID().replaceAll("-", "")}`;
}
