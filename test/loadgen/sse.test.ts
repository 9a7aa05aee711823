import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SseParser } from "../../src/loadgen/sse.ts";

describe("SseParser", () => {
  const stream =
    'data: {"a":1}\n\n: keep-alive\n\ndata: {"b":"é"}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n';
  const expected = ['{"a":1}', '{"b":"é"}', "line1\nline2", "[DONE]"];

  it("parses a whole body", () => {
    const p = new SseParser();
    assert.deepEqual([...p.push(new TextEncoder().encode(stream)), ...p.end()], expected);
  });

  it("gives the same events when the body is split at every byte", () => {
    const bytes = new TextEncoder().encode(stream);
    const p = new SseParser();
    const out: string[] = [];
    for (let i = 0; i < bytes.length; i++) out.push(...p.push(bytes.subarray(i, i + 1)));
    out.push(...p.end());
    assert.deepEqual(out, expected);
  });

  it("returns an event left without its blank line at the end", () => {
    const p = new SseParser();
    assert.deepEqual(p.push(new TextEncoder().encode("data: x")), []);
    assert.deepEqual(p.end(), ["x"]);
  });
});
