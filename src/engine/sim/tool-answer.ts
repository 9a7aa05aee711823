/**
 * Tool calls in vLLM's wire shape, from a choice's scripted text (request-plan.ts ChoiceShape).
 * vllm-project/vllm vllm/entrypoints/openai/chat_completion/serving.py @ 5e918640d7b65820db5beaa98c2a99925bff7c17:
 *
 * - named tool_choice: the decoded text is the arguments object. Streamed, the first delta is
 *   `{id, type: "function", index: <choice index>, function: {name, arguments: <delta>}}`, the
 *   next ones `{index, function: {arguments: <delta>}}`; finish_reason is the output's ("stop").
 *   Whole: `message.content ""`, `tool_calls [{id, type, function: {name, arguments: <text>}}]`.
 * - required (and auto when the parser finds a call): the text is `[{"name", "parameters"}]`.
 *   Streamed (extract_tool_call_required_streaming), a call is announced once its parameters
 *   object has begun: `{id, type, index: <call index>, function: {name, arguments: <args so
 *   far>}}`; then `{index, function: {name: null, arguments: <delta>}}` up to the parameters'
 *   closing brace; finish_reason "tool_calls". Whole: arguments = json.dumps(parameters),
 *   finish_reason "tool_calls" when the output stopped (not cut by length).
 * - auto with a tool parser (Hermes format, `<tool_call>{"name", "arguments"}</tool_call>`):
 *   vllm/tool_parsers/hermes_tool_parser.py @ 02bb669bf661df8b946121215ecb213468247b22.
 *   Streamed (extract_tool_calls_streaming), a call is announced once its name is whole:
 *   `{index: <call index>, type, id, function: {name}}` (no arguments key), then
 *   `{index, function: {arguments: <delta>}}` from the arguments' first character to their
 *   last; the tags are never sent as content. Whole (extract_tool_calls): `content` is the text
 *   before the first `<tool_call>` (null when none), arguments = json.dumps(arguments),
 *   finish_reason "tool_calls"; a cut call fails to parse and comes back as text.
 */
import type { FinishReason } from "./output.ts";
import type { ChoiceShape } from "./request-plan.ts";

type Delta = Record<string, unknown>;

/** The tool_calls deltas for text growing from `from` to `to` characters (null: nothing to send yet). */
export function toolDeltas(
  shape: ChoiceShape,
  choiceIndex: number,
  text: string,
  from: number,
  to: number,
): Delta[] | null {
  if (to <= from) return null;
  if (shape.kind === "named") {
    const args = text.slice(from, to);
    return [
      from === 0
        ? {
            id: shape.id,
            type: "function",
            index: choiceIndex,
            function: { name: shape.name, arguments: args },
          }
        : { index: choiceIndex, function: { arguments: args } },
    ];
  }
  const out: Delta[] = [];
  if (shape.kind === "parsed") {
    shape.calls.forEach((c, k) => {
      if (from < c.nameEnd && to >= c.nameEnd)
        out.push({ index: k, type: "function", id: c.id, function: { name: c.name } });
      const a = Math.max(from, c.start);
      const b = Math.min(to, c.end);
      if (b > a) out.push({ index: k, function: { arguments: text.slice(a, b) } });
    });
    return out.length > 0 ? out : null;
  }
  shape.calls.forEach((c, k) => {
    // Announced once the text so far holds the parameters' opening brace.
    const announcedBefore = from > c.start;
    if (to <= c.start) return;
    if (!announcedBefore)
      out.push({
        id: c.id,
        type: "function",
        index: k,
        function: { name: c.name, arguments: text.slice(c.start, Math.min(to, c.end)) },
      });
    else if (from < c.end)
      out.push({ index: k, function: { name: null, arguments: text.slice(from, Math.min(to, c.end)) } });
  });
  return out.length > 0 ? out : null;
}

/** The finish_reason of a tool-shaped choice. */
export function toolFinishReason(shape: ChoiceShape, finish: FinishReason, stream: boolean): string {
  if (shape.kind === "named") return finish;
  if (stream) return "tool_calls";
  return finish === "stop" ? "tool_calls" : finish;
}

/** The whole message of a tool-shaped choice (null when a cut-off text holds no whole call). */
export function toolMessage(shape: ChoiceShape, text: string, finish: FinishReason): Delta[] | null {
  if (shape.kind === "named")
    return [{ id: shape.id, type: "function", function: { name: shape.name, arguments: text } }];
  if (finish !== "stop") return null;
  return shape.calls.map((c) => ({
    id: c.id,
    type: "function",
    function: { name: c.name, arguments: text.slice(c.start, c.end) },
  }));
}
