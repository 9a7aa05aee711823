/**
 * The Responses API's answers built from chat completions: the whole `Response` object and the
 * event stream (grammar in ./responses.ts's module comment; openai/openai-node
 * src/lib/responses/ResponseAccumulator.ts is what reads it).
 */
import { randomUUID } from "node:crypto";
import type {
  ChatChunk,
  ChatCompletion,
  ChatToolCall,
  ChatToolCallDelta,
  ChatUsage,
  ChoiceSink,
} from "./chat-sse.ts";
import { feedChoice, ToolCallAssembler } from "./chat-sse.ts";
import type { Streamer } from "./translated.ts";

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const id = (prefix: string): string => `${prefix}_${randomUUID().replaceAll("-", "")}`;

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
export class ResponsesStreamer implements Streamer, ChoiceSink {
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
    return feedChoice(c, this);
  }

  text(text: string): string {
    let out = "";
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
    return (
      out +
      this.ev("response.output_text.delta", {
        item_id: this.msg.id,
        output_index: this.msg.at,
        content_index: 0,
        delta: text,
        logprobs: [],
      })
    );
  }

  toolCall(d: ChatToolCallDelta): string {
    let out = "";
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
    return out;
  }

  finished(reason: string): void {
    this.finish = reason;
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
