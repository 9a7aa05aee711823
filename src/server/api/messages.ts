/**
 * Anthropic's Messages API (`POST /v1/messages`) over chat completions: `system`, content
 * blocks (text, image, tool_use, tool_result), tools and `tool_choice`, `stop_sequences`,
 * `max_tokens`, and `stream` with Anthropic's event grammar. Shapes are the SDK's
 * (anthropics/anthropic-sdk-typescript src/resources/messages/messages.ts: `MessageCreateParams`,
 * `Message`, `RawMessageStreamEvent`); its stream parser (src/core/streaming.ts) reads each
 * event by its `event:` name and throws on `event: error`, and `MessageStream`
 * (src/lib/MessageStream.ts) accumulates `message_start` → (`content_block_start` →
 * `content_block_delta`… → `content_block_stop`)… → `message_delta` → `message_stop`.
 * vLLM maps chat results the same way (vllm-project/vllm vllm/entrypoints/anthropic/serving.py
 * @ 82df3f491008e46124f7afb5008c789dc7432515: finish `stop` → `end_turn`, `length` →
 * `max_tokens`, `tool_calls` → `tool_use`; a matched stop string → `stop_sequence`).
 * Errors are `{"type": "error", "error": {"type", "message"}}`.
 */
import { randomUUID } from "node:crypto";
import { BadRequestError, echoInput, type InferaError } from "../../protocol/errors.ts";
import type { ChatChunk, ChatCompletion, ChatToolCallDelta, ChatUsage, ChoiceSink } from "./chat-sse.ts";
import { feedChoice, ToolCallAssembler } from "./chat-sse.ts";
import type { Streamer, Translation } from "./translated.ts";

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const id = (prefix: string): string => `${prefix}_${randomUUID().replaceAll("-", "").slice(0, 24)}`;

export function messagesToChat(b: Obj): Obj {
  if (typeof b.model !== "string" || b.model === "")
    throw new BadRequestError("model: Field required", "model");
  if (typeof b.max_tokens !== "number" || !Number.isInteger(b.max_tokens) || b.max_tokens < 1)
    throw new BadRequestError("max_tokens: Field required (a positive integer)", "max_tokens");
  if (!Array.isArray(b.messages) || b.messages.length === 0)
    throw new BadRequestError("messages: at least one message is required", "messages");
  const messages: Obj[] = [];
  if (typeof b.system === "string") messages.push({ role: "system", content: b.system });
  else if (Array.isArray(b.system)) messages.push({ role: "system", content: textOf(b.system, "system") });
  else if (b.system != null) throw new BadRequestError("system: must be a string or text blocks", "system");
  b.messages.forEach((m, i) => {
    message(m, `messages.${i}`, messages);
  });
  const chat: Obj = { model: b.model, messages, max_tokens: b.max_tokens };
  for (const f of ["temperature", "top_p", "top_k", "stream"] as const) if (b[f] != null) chat[f] = b[f];
  if (Array.isArray(b.stop_sequences) && b.stop_sequences.length > 0) chat.stop = b.stop_sequences;
  if (Array.isArray(b.tools)) chat.tools = b.tools.map(tool);
  else if (b.tools != null) throw new BadRequestError("tools: must be an array", "tools");
  if (b.tool_choice != null) Object.assign(chat, toolChoice(b.tool_choice));
  return chat;
}

function textOf(blocks: unknown[], param: string): string {
  return blocks
    .map((blk, i) => {
      if (!isObj(blk) || blk.type !== "text" || typeof blk.text !== "string")
        throw new BadRequestError(`${param}.${i}: only text blocks are allowed here`, param);
      return blk.text;
    })
    .join("\n");
}

function message(m: unknown, param: string, out: Obj[]): void {
  if (!isObj(m) || (m.role !== "user" && m.role !== "assistant"))
    throw new BadRequestError(`${param}.role: must be 'user' or 'assistant'`, `${param}.role`);
  if (typeof m.content === "string") {
    out.push({ role: m.role, content: m.content });
    return;
  }
  if (!Array.isArray(m.content))
    throw new BadRequestError(`${param}.content: must be a string or blocks`, `${param}.content`);
  const parts: Obj[] = [];
  const calls: Obj[] = [];
  m.content.forEach((blk, i) => {
    const p = `${param}.content.${i}`;
    if (!isObj(blk)) throw new BadRequestError(`${p}: must be an object`, p);
    switch (blk.type) {
      case "text":
        if (typeof blk.text !== "string") throw new BadRequestError(`${p}.text: Field required`, p);
        parts.push({ type: "text", text: blk.text });
        return;
      case "image":
        parts.push(image(blk, p));
        return;
      case "tool_use":
        if (m.role !== "assistant")
          throw new BadRequestError(`${p}: tool_use blocks belong to assistant turns`, p);
        if (typeof blk.id !== "string" || typeof blk.name !== "string")
          throw new BadRequestError(`${p}: tool_use needs 'id' and 'name'`, p);
        calls.push({
          id: blk.id,
          type: "function",
          function: { name: blk.name, arguments: JSON.stringify(blk.input ?? {}) },
        });
        return;
      case "tool_result":
        if (m.role !== "user") throw new BadRequestError(`${p}: tool_result blocks belong to user turns`, p);
        if (typeof blk.tool_use_id !== "string")
          throw new BadRequestError(`${p}.tool_use_id: Field required`, p);
        // Chat carries a tool's answer as its own message, ahead of the user's other content.
        out.push({ role: "tool", tool_call_id: blk.tool_use_id, content: toolResult(blk.content, p) });
        return;
      case "thinking":
      case "redacted_thinking":
        return;
      default:
        throw new BadRequestError(
          `${p}.type: '${echoInput(String(blk.type))}' blocks are not supported by this gateway`,
          p,
        );
    }
  });
  if (m.role === "assistant") {
    const text = parts.map((x) => x.text ?? "").join("");
    if (calls.length > 0)
      out.push({ role: "assistant", content: text === "" ? null : text, tool_calls: calls });
    else out.push({ role: "assistant", content: text });
  } else if (parts.length > 0) out.push({ role: "user", content: parts });
}

function image(blk: Obj, p: string): Obj {
  const src = blk.source;
  if (
    isObj(src) &&
    src.type === "base64" &&
    typeof src.data === "string" &&
    typeof src.media_type === "string"
  )
    return { type: "image_url", image_url: { url: `data:${src.media_type};base64,${src.data}` } };
  if (isObj(src) && src.type === "url" && typeof src.url === "string")
    return { type: "image_url", image_url: { url: src.url } };
  throw new BadRequestError(`${p}.source: only base64 and url images are supported`, p);
}

function toolResult(c: unknown, p: string): string {
  if (c == null) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return textOf(c, `${p}.content`);
  throw new BadRequestError(`${p}.content: must be a string or text blocks`, p);
}

function tool(t: unknown, i: number): Obj {
  if (!isObj(t) || typeof t.name !== "string")
    throw new BadRequestError(`tools.${i}.name: Field required`, `tools.${i}`);
  if (t.type !== undefined && t.type !== "custom")
    throw new BadRequestError(
      `tools.${i}: server tools ('${echoInput(String(t.type))}') are not supported`,
      `tools.${i}`,
    );
  const fn: Obj = { name: t.name, parameters: t.input_schema ?? { type: "object" } };
  if (t.description != null) fn.description = t.description;
  return { type: "function", function: fn };
}

function toolChoice(c: unknown): Obj {
  if (!isObj(c)) throw new BadRequestError("tool_choice: must be an object", "tool_choice");
  const out: Obj = {};
  if (c.disable_parallel_tool_use === true) out.parallel_tool_calls = false;
  if (c.type === "auto") out.tool_choice = "auto";
  else if (c.type === "any") out.tool_choice = "required";
  else if (c.type === "none") out.tool_choice = "none";
  else if (c.type === "tool" && typeof c.name === "string")
    out.tool_choice = { type: "function", function: { name: c.name } };
  else throw new BadRequestError("tool_choice.type: must be auto, any, tool or none", "tool_choice");
  return out;
}

// --- answers ------------------------------------------------------------------------------

/** Anthropic's stop reason (and matched stop sequence) for a chat finish. */
function stopOf(
  finish: string | null | undefined,
  matched: string | number | null | undefined,
  b: Obj,
  calledTools: boolean,
): { stop_reason: string; stop_sequence: string | null } {
  if (finish === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  // vLLM ends a named (and, in some versions, a required) tool choice with finish "stop"
  // (serving_chat.py sets "tool_calls" only for auto-parsed calls); Anthropic's answer with
  // tool_use blocks stops for "tool_use" all the same.
  if (finish === "tool_calls" || (finish === "stop" && calledTools))
    return { stop_reason: "tool_use", stop_sequence: null };
  const seqs = Array.isArray(b.stop_sequences) ? b.stop_sequences : [];
  if (typeof matched === "string" && seqs.includes(matched))
    return { stop_reason: "stop_sequence", stop_sequence: matched };
  return { stop_reason: "end_turn", stop_sequence: null };
}

const usageOf = (u: ChatUsage | null | undefined): Obj => ({
  input_tokens: u?.prompt_tokens ?? 0,
  output_tokens: u?.completion_tokens ?? 0,
  cache_read_input_tokens: u?.prompt_tokens_details?.cached_tokens ?? 0,
  cache_creation_input_tokens: 0,
});

function parseInput(args: string): unknown {
  try {
    const v = JSON.parse(args === "" ? "{}" : args);
    return isObj(v) ? v : { value: v };
  } catch {
    return {};
  }
}

export function chatToMessage(chat: ChatCompletion, b: Obj): Obj {
  const choice = chat.choices?.[0];
  const content: Obj[] = [];
  const text = choice?.message?.content ?? "";
  if (text !== "") content.push({ type: "text", text });
  for (const c of choice?.message?.tool_calls ?? [])
    content.push({
      type: "tool_use",
      id: c.id,
      name: c.function.name,
      input: parseInput(c.function.arguments),
    });
  return {
    id: id("msg"),
    type: "message",
    role: "assistant",
    model: b.model,
    content,
    ...stopOf(choice?.finish_reason, choice?.stop_reason, b, (choice?.message?.tool_calls ?? []).length > 0),
    usage: usageOf(chat.usage),
  };
}

const sse = (type: string, fields: Obj): string =>
  `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;

class MessagesStreamer implements Streamer, ChoiceSink {
  private index = -1;
  /** The open block: text, or the tool call at this assembler position. */
  private open: { kind: "text" } | { kind: "tool"; at: number } | null = null;
  private readonly calls = new ToolCallAssembler();
  private finish: string | null | undefined;
  private matched: string | number | null | undefined;

  private readonly b: Obj;

  constructor(b: Obj) {
    this.b = b;
  }

  start(promptTokens: () => number | undefined): string {
    const message = {
      id: id("msg"),
      type: "message",
      role: "assistant",
      model: this.b.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      // The engine's count comes at the end (message_delta); here, routing's, when it has one.
      usage: { input_tokens: promptTokens() ?? 0, output_tokens: 0 },
    };
    return sse("message_start", { message }) + sse("ping", {});
  }

  private close(): string {
    if (!this.open) return "";
    this.open = null;
    return sse("content_block_stop", { index: this.index });
  }

  chunk(c: ChatChunk): string {
    return feedChoice(c, this);
  }

  text(text: string): string {
    let out = "";
    if (this.open?.kind !== "text") {
      out += this.close();
      this.open = { kind: "text" };
      out += sse("content_block_start", { index: ++this.index, content_block: { type: "text", text: "" } });
    }
    return out + sse("content_block_delta", { index: this.index, delta: { type: "text_delta", text } });
  }

  toolCall(d: ChatToolCallDelta): string {
    let out = "";
    const { at, opened, args } = this.calls.push(d, () => id("toolu"));
    if (opened || this.open?.kind !== "tool" || this.open.at !== at) {
      out += this.close();
      this.open = { kind: "tool", at };
      const call = this.calls.calls[at]!;
      out += sse("content_block_start", {
        index: ++this.index,
        content_block: { type: "tool_use", id: call.id, name: call.name, input: {} },
      });
    }
    if (args !== "")
      out += sse("content_block_delta", {
        index: this.index,
        delta: { type: "input_json_delta", partial_json: args },
      });
    return out;
  }

  finished(reason: string, stopReason: string | number | null | undefined): void {
    this.finish = reason;
    this.matched = stopReason;
  }

  end(usage: ChatUsage | null, failed?: string): string {
    let out = this.close();
    if (failed) return `${out}${sse("error", { error: { type: "api_error", message: failed } })}`;
    out += sse("message_delta", {
      delta: stopOf(this.finish, this.matched, this.b, this.calls.calls.length > 0),
      usage: usageOf(usage),
    });
    return out + sse("message_stop", {});
  }
}

/** Anthropic's error type for a status (docs.anthropic.com "Errors"; the SDK's `ErrorType`). */
function anthropicType(status: number): string {
  if (status === 400) return "invalid_request_error";
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 413) return "request_too_large";
  if (status === 429) return "rate_limit_error";
  if (status === 503 || status === 529) return "overloaded_error";
  if (status === 504) return "timeout_error";
  return status < 500 ? "invalid_request_error" : "api_error";
}

export const messagesTranslation: Translation = {
  label: "messages",
  native: "messages",
  toChat: messagesToChat,
  whole: chatToMessage,
  streamer: (b) => new MessagesStreamer(b),
  errorBody: (e: InferaError) => ({
    type: "error",
    error: { type: anthropicType(e.status), message: e.message },
  }),
};
