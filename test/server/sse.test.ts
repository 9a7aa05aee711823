import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SseUsageFilter } from "../../src/server/sse.ts";

const ev = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;

describe("SseUsageFilter", () => {
  const stream =
    ev({ choices: [{ delta: { content: "a" } }] }) +
    ev({ choices: [{ delta: { content: "b" } }] }) +
    ev({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 2 } }) +
    "data: [DONE]\n\n";

  function run(strip: boolean, cuts: number[]): { out: string; usage: unknown } {
    const f = new SseUsageFilter(strip);
    const buf = Buffer.from(stream);
    let out = "";
    let prev = 0;
    for (const c of [...cuts, buf.length]) {
      out += f.push(buf.subarray(prev, c)).toString();
      prev = c;
    }
    out += f.flush().toString();
    return { out, usage: f.usage };
  }

  it("passes everything through and reads usage when the client asked", () => {
    for (const cuts of [[], [5], [30, 31, 90, 100, 150], Array.from({ length: 40 }, (_, i) => i * 5)]) {
      const r = run(false, cuts);
      assert.equal(r.out, stream);
      assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 2 });
    }
  });

  it("strips only the usage-only chunk when the server added include_usage", () => {
    for (const cuts of [[], [17], Array.from({ length: 60 }, (_, i) => i * 3)]) {
      const r = run(true, cuts);
      assert.equal(
        r.out,
        stream.replace(ev({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 2 } }), ""),
      );
      assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 2 });
    }
  });
});
