/**
 * OpenAI's Responses API (`POST /v1/responses`) over chat completions, for the stateless
 * subset: text and image inputs, `instructions`, function tools and function-call items,
 * `text.format`, and `stream` with the Responses event grammar. The shapes are openai-node's
 * (openai/openai-node src/resources/responses/responses.ts: `ResponseCreateParams`, `Response`,
 * `ResponseStreamEvent`), and the stream is what its `ResponseStream` accumulator accepts
 * (src/lib/responses/ResponseAccumulator.ts): `response.created` first, then per output item
 * `output_item.added` → (`content_part.added` → `output_text.delta`… → `output_text.done` →
 * `content_part.done` | `function_call_arguments.delta`… → `.done`) → `output_item.done`, and
 * `response.completed` (or `response.incomplete`) last, every event with a `sequence_number`.
 *
 * State: `previous_response_id`, `conversation`, `store: true` and `background: true` are refused
 * with a 400 naming the field. The server keeps nothing per request that another replica could
 * not rebuild (docs/architecture.md §1); a response store would need a shared backend and a
 * per-key access rule to be correct behind a load balancer. Clients resend the history as
 * `input` items instead, which is what the translation supports.
 */
import { randomUUID } from "node:crypto";
import { BadRequestError, echoInput, type InferaError } from "../../protocol/errors.ts";
import type { ChatChunk, ChatCompletion, ChatToolCall, ChatUsage } from "./chat-sse.ts";
import { ToolCallAssembler } from "./chat-sse.ts";
import type { Streamer, Translation } from "./translated.ts";

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const id = (prefix: string): string => `${prefix}_${randomUUID().replaceAll("-", "")}`;

/** Fields that need state the server does not keep (see the module comment). */
const STATEFUL = ["previous_response_id", "conversation"] as const;
/** Fields passed to the chat request under the same name. */
const SAME = ["model", "temperature", "top_p", "parallel_tool_calls", "user", "stream", "seed"] as const;

export function responsesToChat(b: Obj): Obj {
  for (const f of STATEFUL)
    if (b[f] !== undefined && b[f] !== null)
      throw new BadRequestError(
        `'${f}' is not supported: this gateway keeps no response state; resend the conversation as 'input' items.`,
        f,
        "unsupported_parameter",
      );
  if (b.store === true)
    throw new BadRequestError(
      "'store: true' is not supported: this gateway keeps no response state; send 'store: false' or omit it.",
      "store",
      "unsupported_parameter",
    );
  if (b.background === true)
    throw new BadRequestError(
      "'background' responses are not supported.",
      "background",
      "unsupported_parameter",
    );
  if (typeof b.model !== "string" || b.model === "")
    throw new BadRequestError("'model' is required.", "model");
  const messages: Obj[] = [];
  if (b.instructions !== undefined && b.instructions !== null) {
    if (typeof b.instructions !== "string")
      throw new BadRequestError("'instructions' must be a string.", "instructions");
    messages.push({ role: "system", content: b.instructions });
  }
  if (typeof b.input === "string") messages.push({ role: "user", content: b.input });
  else if (Array.isArray(b.input))
    b.input.forEach((item, i) => {
      inputItem(item, i, messages);
    });
  else throw new BadRequestError("'input' must be a string or an array of input items.", "input");
  if (messages.length === 0) throw new BadRequestError("'input' must not be empty.", "input");
  const chat: Obj = { messages };
  for (const f of SAME) if (b[f] !== undefined && b[f] !== null) chat[f] = b[f];
  if (typeof b.max_output_tokens === "number") chat.max_tokens = b.max_output_tokens;
  if (b.tools !== undefined) chat.tools = tools(b.tools);
  if (b.tool_choice !== undefined) chat.tool_choice = toolChoice(b.tool_choice);
  const format = isObj(b.text) ? b.text.format : undefined;
  if (format !== undefined) chat.response_format = responseFormat(format);
  return chat;
}

function inputItem(item: unknown, i: number, out: Obj[]): void {
  const param = `input[${i}]`;
  if (!isObj(item)) throw new BadRequestError("Each input item must be an object.", param);
  const type = item.type ?? "message";
  if (type === "message") {
    const role = item.role;
    if (role !== "user" && role !== "assistant" && role !== "system" && role !== "developer")
      throw new BadRequestError(`Unsupported role '${echoInput(String(role))}'.`, `${param}.role`);
    out.push({
      role: role === "developer" ? "system" : role,
      content: content(item.content, `${param}.content`),
    });
    return;
  }
  if (type === "function_call") {
    if (typeof item.name !== "string" || typeof item.call_id !== "string")
      throw new BadRequestError("A function_call item needs 'name' and 'call_id'.", param);
    const call = {
      id: item.call_id,
      type: "function",
      function: { name: item.name, arguments: typeof item.arguments === "string" ? item.arguments : "{}" },
    };
    // Consecutive calls are one assistant turn with several tool calls, as chat has them.
    const last = out[out.length - 1];
    if (last?.role === "assistant" && Array.isArray(last.tool_calls)) last.tool_calls.push(call);
    else out.push({ role: "assistant", content: null, tool_calls: [call] });
    return;
  }
  if (type === "function_call_output") {
    if (typeof item.call_id !== "string")
      throw new BadRequestError("A function_call_output item needs 'call_id'.", `${param}.call_id`);
    const output = typeof item.output === "string" ? item.output : JSON.stringify(item.output ?? "");
    out.push({ role: "tool", tool_call_id: item.call_id, content: output });
    return;
  }
  // Earlier reasoning carries nothing the chat template would render.
  if (type === "reasoning") return;
  throw new BadRequestError(
    `Input items of type '${echoInput(String(type))}' are not supported by this gateway.`,
    `${param}.type`,
    "unsupported_parameter",
  );
}

function content(c: unknown, param: string): unknown {
  if (typeof c === "string") return c;
  if (!Array.isArray(c)) throw new BadRequestError("'content' must be a string or an array of parts.", param);
  return c.map((p, i) => {
    if (!isObj(p)) throw new BadRequestError("Each content part must be an object.", `${param}[${i}]`);
    if ((p.type === "input_text" || p.type === "output_text") && typeof p.text === "string")
      return { type: "text", text: p.text };
    if (p.type === "input_image") {
      if (typeof p.image_url !== "string")
        throw new BadRequestError(
          "Only 'image_url' images are supported (not 'file_id').",
          `${param}[${i}]`,
          "unsupported_parameter",
        );
      const image_url: Obj = { url: p.image_url };
      if (typeof p.detail === "string" && p.detail !== "auto") image_url.detail = p.detail;
      return { type: "image_url", image_url };
    }
    throw new BadRequestError(
      `Content parts of type '${echoInput(String(p.type))}' are not supported by this gateway.`,
      `${param}[${i}].type`,
      "unsupported_parameter",
    );
  });
}

function tools(t: unknown): Obj[] {
  if (!Array.isArray(t)) throw new BadRequestError("'tools' must be an array.", "tools");
  return t.map((tool, i) => {
    if (!isObj(tool) || tool.type !== "function" || typeof tool.name !== "string")
      throw new BadRequestError(
        "Only function tools are supported by this gateway.",
        `tools[${i}]`,
        "unsupported_parameter",
      );
    const fn: Obj = { name: tool.name };
    if (tool.description != null) fn.description = tool.description;
    if (tool.parameters != null) fn.parameters = tool.parameters;
    if (tool.strict != null) fn.strict = tool.strict;
    return { type: "function", function: fn };
  });
}

function toolChoice(c: unknown): unknown {
  if (c === "auto" || c === "none" || c === "required") return c;
  if (isObj(c) && c.type === "function" && typeof c.name === "string")
    return { type: "function", function: { name: c.name } };
  throw new BadRequestError(
    "'tool_choice' must be auto, none, required or a function.",
    "tool_choice",
    "unsupported_parameter",
  );
}

function responseFormat(f: unknown): unknown {
  if (!isObj(f)) throw new BadRequestError("'text.format' must be an object.", "text.format");
  if (f.type === "text" || f.type === "json_object") return { type: f.type };
  if (f.type === "json_schema") {
    const js: Obj = { name: f.name ?? "response", schema: f.schema };
    if (f.strict != null) js.strict = f.strict;
    if (f.description != null) js.description = f.description;
    return { type: "json_schema", json_schema: js };
  }
  throw new BadRequestError(`Unsupported text format '${echoInput(String(f.type))}'.`, "text.format.type");
}

// --- answers ------------------------------------------------------------------------------

function usageOf(u: ChatUsage | null | undefined): Obj {
  const input = u?.prompt_tokens ?? 0;
  const output = u?.completion_tokens ?? 0;
  return {
    input_tokens: input,
    input_tokens_details: { cached_tokens: u?.prompt_tokens_details?.cached_tokens ?? 0 },
    output_tokens: output,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u?.total_tokens ?? input + output,
  };
}

/** The `Response` object around `output`, echoing the request's settings as OpenAI does. */
function responseObject(rid: string, b: Obj, created: number, extra: Obj): Obj {
  return {
    id: rid,
    object: "response",
    created_at: created,
    status: "in_progress",
    error: null,
    incomplete_details: null,
    instructions: b.instructions ?? null,
    max_output_tokens: b.max_output_tokens ?? null,
    model: b.model,
    output: [],
    parallel_tool_calls: b.parallel_tool_calls ?? true,
    previous_response_id: null,
    reasoning: null,
    store: false,
    temperature: b.temperature ?? null,
    text: { format: isObj(b.text) && b.text.format !== undefined ? b.text.format : { type: "text" } },
    tool_choice: b.tool_choice ?? "auto",
    tools: b.tools ?? [],
    top_p: b.top_p ?? null,
    truncation: "disabled",
    usage: null,
    metadata: b.metadata ?? {},
    ...extra,
  };
}

const messageItem = (mid: string, text: string, status: string): Obj => ({
  id: mid,
  type: "message",
  status,
  role: "assistant",
  content: text === "" && status === "in_progress" ? [] : [outputText(text)],
});
const outputText = (text: string): Obj => ({ type: "output_text", text, annotations: [], logprobs: [] });
const callItem = (c: { id: string; name: string; arguments: string }, fid: string, status: string): Obj => ({
  id: fid,
  type: "function_call",
  status,
  call_id: c.id,
  name: c.name,
  arguments: c.arguments,
});

/** `length` → incomplete (max_output_tokens), anything else → completed. */
const endStatus = (finish: string | null | undefined): { status: string; incomplete_details: Obj | null } =>
  finish === "length"
    ? { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } }
    : { status: "completed", incomplete_details: null };

export function chatToResponse(chat: ChatCompletion, b: Obj): Obj {
  const choice = chat.choices?.[0];
  const output: Obj[] = [];
  const text = choice?.message?.content ?? "";
  if (text !== "") output.push(messageItem(id("msg"), text, "completed"));
  for (const c of (choice?.message?.tool_calls ?? []) as ChatToolCall[])
    output.push(
      callItem({ id: c.id, name: c.function.name, arguments: c.function.arguments }, id("fc"), "completed"),
    );
  return responseObject(id("resp"), b, Math.floor(Date.now() / 1000), {
    ...endStatus(choice?.finish_reason),
    output,
    usage: usageOf(chat.usage),
  });
}

/** One Responses stream, written from chat chunks. */
class ResponsesStreamer implements Streamer {
  private seq = 0;
  private readonly rid = id("resp");
  private readonly created = Math.floor(Date.now() / 1000);
  private readonly output: Obj[] = [];
  /** The open message item: its output index and text so far. */
  private msg: { at: number; id: string; text: string } | null = null;
  private readonly calls = new ToolCallAssembler();
  /** Output index and item id per assembled call. */
  private readonly callAt: Array<{ at: number; id: string }> = [];
  private finish: string | null | undefined;

  private readonly b: Obj;

  constructor(b: Obj) {
    this.b = b;
  }

  private ev(type: string, fields: Obj): string {
    return `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: this.seq++, ...fields })}\n\n`;
  }

  private snapshot(extra: Obj): Obj {
    return responseObject(this.rid, this.b, this.created, extra);
  }

  start(): string {
    const r = this.snapshot({});
    return this.ev("response.created", { response: r }) + this.ev("response.in_progress", { response: r });
  }

  chunk(c: ChatChunk): string {
    const choice = c.choices?.[0];
    if (!choice) return "";
    let out = "";
    const text = choice.delta?.content;
    if (text) {
      if (!this.msg) {
        this.msg = { at: this.output.length, id: id("msg"), text: "" };
        this.output.push({});
        out += this.ev("response.output_item.added", {
          output_index: this.msg.at,
          item: messageItem(this.msg.id, "", "in_progress"),
        });
        out += this.ev("response.content_part.added", {
          item_id: this.msg.id,
          output_index: this.msg.at,
          content_index: 0,
          part: outputText(""),
        });
      }
      this.msg.text += text;
      out += this.ev("response.output_text.delta", {
        item_id: this.msg.id,
        output_index: this.msg.at,
        content_index: 0,
        delta: text,
        logprobs: [],
      });
    }
    for (const d of choice.delta?.tool_calls ?? []) {
      const { at, opened, args } = this.calls.push(d, () => id("call"));
      if (opened) {
        out += this.closeMessage();
        const fid = id("fc");
        this.callAt[at] = { at: this.output.length, id: fid };
        this.output.push({});
        out += this.ev("response.output_item.added", {
          output_index: this.callAt[at]!.at,
          item: callItem({ ...this.calls.calls[at]!, arguments: "" }, fid, "in_progress"),
        });
      }
      if (args !== "")
        out += this.ev("response.function_call_arguments.delta", {
          item_id: this.callAt[at]!.id,
          output_index: this.callAt[at]!.at,
          delta: args,
        });
    }
    if (choice.finish_reason) this.finish = choice.finish_reason;
    return out;
  }

  /** Ends the open message item (text done, part done, item done). */
  private closeMessage(): string {
    const m = this.msg;
    if (!m) return "";
    this.msg = null;
    const item = messageItem(m.id, m.text, "completed");
    this.output[m.at] = item;
    const where = { item_id: m.id, output_index: m.at, content_index: 0 };
    return (
      this.ev("response.output_text.done", { ...where, text: m.text, logprobs: [] }) +
      this.ev("response.content_part.done", { ...where, part: outputText(m.text) }) +
      this.ev("response.output_item.done", { output_index: m.at, item })
    );
  }

  end(usage: ChatUsage | null, failed?: string): string {
    let out = this.closeMessage();
    this.calls.calls.forEach((c, i) => {
      const { at, id: fid } = this.callAt[i]!;
      const item = callItem(c, fid, "completed");
      this.output[at] = item;
      out += this.ev("response.function_call_arguments.done", {
        item_id: fid,
        output_index: at,
        name: c.name,
        arguments: c.arguments,
      });
      out += this.ev("response.output_item.done", { output_index: at, item });
    });
    if (failed) {
      const error = { code: "server_error", message: failed };
      return `${out}${this.ev("response.failed", { response: this.snapshot({ status: "failed", error, output: this.output, usage: usageOf(usage) }) })}`;
    }
    const end = endStatus(this.finish);
    const response = this.snapshot({ ...end, output: this.output, usage: usageOf(usage) });
    return (
      out + this.ev(end.status === "completed" ? "response.completed" : "response.incomplete", { response })
    );
  }
}

export const responsesTranslation: Translation = {
  label: "responses",
  native: "responses",
  toChat: responsesToChat,
  whole: chatToResponse,
  streamer: (b) => new ResponsesStreamer(b),
  errorBody: (e: InferaError) => e.toJSON(),
};
