/**
 * Streamed tool-call deltas as vLLM cuts them, text chunk by text chunk:
 * vllm-project/vllm vllm/entrypoints/openai/chat_completion/serving.py @ 5e918640d7b65820db5beaa98c2a99925bff7c17
 * (named: first delta id + type + name + the text so far, then {index, function: {arguments}};
 * required: extract_tool_call_required_streaming announces a call once its "parameters" object
 * has begun, then sends {index, function: {name: null, arguments}} up to the parameters' closing
 * brace, dropping the list's own "}" and "]").
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { ChoiceShape } from "../../../src/engine/sim/request-plan.ts";
import { toolDeltas, toolFinishReason, toolMessage } from "../../../src/engine/sim/tool-answer.ts";

describe("tool-call deltas", () => {
  it("named: id and name first, then the arguments alone; they join to the text", () => {
    const shape: ChoiceShape = { kind: "named", name: "f", id: "chatcmpl-tool-1" };
    const text = '{"a": 1}';
    assert.deepEqual(toolDeltas(shape, 2, text, 0, 2), [
      { id: "chatcmpl-tool-1", type: "function", index: 2, function: { name: "f", arguments: '{"' } },
    ]);
    assert.deepEqual(toolDeltas(shape, 2, text, 2, text.length), [
      { index: 2, function: { arguments: 'a": 1}' } },
    ]);
    assert.equal(toolDeltas(shape, 2, text, 3, 3), null);
    assert.equal(toolFinishReason(shape, "stop", true), "stop");
  });

  it("required: nothing before the parameters begin; arguments end at their closing brace", () => {
    const text = '[{"name": "f", "parameters": {"x": "y"}}]';
    const start = text.indexOf("{", 2);
    const end = text.lastIndexOf("}", text.length - 3) + 1;
    const shape: ChoiceShape = { kind: "calls", calls: [{ name: "f", id: "id0", start, end }] };
    assert.equal(toolDeltas(shape, 0, text, 0, start), null);
    assert.deepEqual(toolDeltas(shape, 0, text, 0, start + 3), [
      { id: "id0", type: "function", index: 0, function: { name: "f", arguments: '{"x' } },
    ]);
    assert.deepEqual(toolDeltas(shape, 0, text, start + 3, text.length), [
      { index: 0, function: { name: null, arguments: '": "y"}' } },
    ]);
    assert.equal(toolDeltas(shape, 0, text, end, text.length), null);
    assert.equal(toolFinishReason(shape, "stop", true), "tool_calls");
    assert.deepEqual(toolMessage(shape, text, "stop"), [
      { id: "id0", type: "function", function: { name: "f", arguments: '{"x": "y"}' } },
    ]);
    // Cut by max_tokens: no whole call, and the whole answer keeps finish_reason "length".
    assert.equal(toolMessage(shape, text.slice(0, 20), "length"), null);
    assert.equal(toolFinishReason(shape, "length", false), "length");
  });

  // vllm/tool_parsers/hermes_tool_parser.py @ 02bb669bf661df8b946121215ecb213468247b22
  // extract_tool_calls_streaming: the name once whole (no arguments key), then argument diffs.
  it("auto (hermes): a name-only announcement once the name is whole, then arguments alone", () => {
    const text = '<tool_call>\n{"name": "f", "arguments": {"x": "y"}}\n</tool_call>';
    const nameEnd = text.indexOf('"f"') + 3;
    const start = text.indexOf('{"x');
    const end = text.indexOf("}") + 1;
    const shape: ChoiceShape = { kind: "parsed", calls: [{ name: "f", id: "id0", nameEnd, start, end }] };
    assert.equal(toolDeltas(shape, 0, text, 0, nameEnd - 1), null);
    assert.deepEqual(toolDeltas(shape, 0, text, nameEnd - 1, start + 2), [
      { index: 0, type: "function", id: "id0", function: { name: "f" } },
      { index: 0, function: { arguments: '{"' } },
    ]);
    assert.deepEqual(toolDeltas(shape, 0, text, start + 2, text.length), [
      { index: 0, function: { arguments: 'x": "y"}' } },
    ]);
    assert.deepEqual(toolMessage(shape, text, "stop"), [
      { id: "id0", type: "function", function: { name: "f", arguments: '{"x": "y"}' } },
    ]);
    assert.equal(toolFinishReason(shape, "stop", false), "tool_calls");
  });
});
