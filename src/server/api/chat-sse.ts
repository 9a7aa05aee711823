/**
 * Reading an engine's chat-completion answer for the translated endpoints (/v1/responses,
 * /v1/messages): the event stream's chunks as parsed objects, and the shapes both
 * translations read. The chunk grammar is OpenAI's `ChatCompletionChunk`
 * (openai/openai-node src/resources/chat/completions/completions.ts), which vLLM, SGLang and
 * ATOM all emit: `data: {json}\n\n` events ending with `data: [DONE]`.
 */
import { UpstreamError } from "../../protocol/errors.ts";

export interface ChatToolCallDelta {
  index: number;
  id?: string | null;
  type?: string | null;
  function?: { name?: string | null; arguments?: string | null } | null;
}

export interface ChatChunk {
  id?: string;
  model?: string;
  choices?: Array<{
    index: number;
    delta?: { role?: string | null; content?: string | null; tool_calls?: ChatToolCallDelta[] | null };
    finish_reason?: string | null;
    /** vLLM: the matched stop string or token id. */
    stop_reason?: string | number | null;
  }>;
  usage?: ChatUsage | null;
  /** An error event in OpenAI's shape (an engine failing mid-stream). */
  error?: { message?: string };
}

/** What a translation's stream writer does with each part of a chunk's choice. */
export interface ChoiceSink {
  /** New text; returns the events to write. */
  text(text: string): string;
  /** One tool call's delta; returns the events to write. */
  toolCall(d: ChatToolCallDelta): string;
  /** The choice's finish reason and (vLLM) matched stop. */
  finished(reason: string, stopReason: string | number | null | undefined): void;
}

/**
 * Feeds a chunk's first choice to `sink` in the order both translated APIs write it (the
 * text, then the tool-call deltas, then the finish) and returns the events written.
 */
export function feedChoice(c: ChatChunk, sink: ChoiceSink): string {
  const choice = c.choices?.[0];
  if (!choice) return "";
  let out = "";
  const text = choice.delta?.content;
  if (text) out += sink.text(text);
  for (const d of choice.delta?.tool_calls ?? []) out += sink.toolCall(d);
  if (choice.finish_reason) sink.finished(choice.finish_reason, choice.stop_reason);
  return out;
}

export interface ChatUsage {
  prompt_tokens?: number;
  completion_tokens?: number;
  total_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number | null } | null;
}

export interface ChatToolCall {
  id: string;
  type?: string;
  function: { name: string; arguments: string };
}

/** A non-streamed chat completion, as far as the translations read it. */
export interface ChatCompletion {
  id?: string;
  model?: string;
  choices?: Array<{
    index: number;
    message?: { content?: string | null; tool_calls?: ChatToolCall[] | null; refusal?: string | null };
    finish_reason?: string | null;
    stop_reason?: string | number | null;
  }>;
  usage?: ChatUsage | null;
}

/** Longest single event accepted from an engine before the stream counts as invalid. */
const MAX_EVENT_BYTES = 16 * 1024 * 1024;

/**
 * The chunks of a chat event stream, parsed, until `[DONE]` or the body's end. Throws an
 * UpstreamError (502) on an event that is not JSON or is too long.
 */
export async function* chatChunks(body: AsyncIterable<Uint8Array>): AsyncGenerator<ChatChunk> {
  const decoder = new TextDecoder();
  let buf = "";
  for await (const bytes of body) {
    buf += decoder.decode(bytes, { stream: true });
    let end = eventEnd(buf);
    while (end) {
      const [at, sep] = end;
      const event = buf.slice(0, at);
      buf = buf.slice(at + sep);
      const data = dataOf(event);
      if (data === "[DONE]") return;
      if (data !== null) yield parseChunk(data);
      end = eventEnd(buf);
    }
    if (buf.length > MAX_EVENT_BYTES) throw invalid();
  }
  const data = dataOf(buf);
  if (data !== null && data !== "[DONE]" && data.trim() !== "") yield parseChunk(data);
}

function eventEnd(buf: string): [number, number] | null {
  const lf = buf.indexOf("\n\n");
  const crlf = buf.indexOf("\r\n\r\n");
  if (lf < 0 && crlf < 0) return null;
  if (crlf >= 0 && (lf < 0 || crlf < lf)) return [crlf, 4];
  return [lf, 2];
}

/** The `data:` lines of one event joined (SSE), or null when it has none (a comment, a ping). */
function dataOf(event: string): string | null {
  let out: string | null = null;
  for (const line of event.split(/\r?\n/)) {
    if (!line.startsWith("data:")) continue;
    const v = line.charCodeAt(5) === 0x20 ? line.slice(6) : line.slice(5);
    out = out === null ? v : `${out}\n${v}`;
  }
  return out;
}

function parseChunk(data: string): ChatChunk {
  let v: unknown;
  try {
    v = JSON.parse(data);
  } catch {
    throw invalid();
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw invalid();
  return v as ChatChunk;
}

const invalid = (): UpstreamError =>
  new UpstreamError(
    "The worker serving this stream sent data that is not an OpenAI event stream.",
    502,
    "upstream_invalid_response",
  );

/** Tool calls being streamed, assembled by their index. */
export class ToolCallAssembler {
  readonly calls: Array<{ id: string; name: string; arguments: string }> = [];

  /** Applies one delta; returns the call's position and whether the delta opened it. */
  push(d: ChatToolCallDelta, newId: () => string): { at: number; opened: boolean; args: string } {
    let at = this.byIndex.get(d.index);
    let opened = false;
    if (at === undefined) {
      at = this.calls.length;
      this.byIndex.set(d.index, at);
      this.calls.push({ id: d.id ?? newId(), name: d.function?.name ?? "", arguments: "" });
      opened = true;
    }
    const call = this.calls[at]!;
    if (!opened && d.function?.name) call.name += d.function.name;
    const args = d.function?.arguments ?? "";
    call.arguments += args;
    return { at, opened, args };
  }

  private readonly byIndex = new Map<number, number>();
}
