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
import { BadRequestError, echoInput, type InferaError } from "../../protocol/errors.ts";
import { chatToResponse, ResponsesStreamer } from "./responses-answer.ts";
import type { Translation } from "./translated.ts";

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

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

export const responsesTranslation: Translation = {
  label: "responses",
  native: "responses",
  toChat: responsesToChat,
  whole: chatToResponse,
  streamer: (b) => new ResponsesStreamer(b),
  errorBody: (e: InferaError) => e.toJSON(),
};
