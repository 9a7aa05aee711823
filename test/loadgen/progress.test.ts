import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { describe, it } from "node:test";
import { createProgress } from "../../src/loadgen/progress.ts";

function capture(): { stream: PassThrough; text: () => string } {
  const stream = new PassThrough();
  let out = "";
  stream.on("data", (b: Buffer) => {
    out += b.toString();
  });
  return { stream, text: () => out };
}

const p = (done: number, elapsedMs: number) => ({
  done,
  total: 10,
  ok: done,
  errors: 0,
  inFlight: 1,
  elapsedMs,
});

describe("progress", () => {
  it("on a TTY redraws one bar in place and ends with a newline", () => {
    const c = capture();
    const r = createProgress(c.stream, { tty: true, intervalMs: 0 });
    r.update(p(5, 1000));
    r.update(p(10, 2000));
    r.finish();
    const t = c.text();
    assert.match(t, /^\r\[#{15}\.{15}\] {2}50% 5\/10 done/);
    assert.match(t, /\r\[#{30}\] 100% 10\/10 done/);
    assert.ok(t.endsWith("\n"));
    assert.equal(t.split("\n").length, 2);
  });

  it("without a TTY prints plain lines on a timer, and a last line at the end", async () => {
    const c = capture();
    const r = createProgress(c.stream, { tty: false, intervalMs: 30 });
    r.update(p(3, 10));
    await new Promise((res) => setTimeout(res, 80));
    r.update(p(10, 100));
    r.finish();
    const lines = c.text().trim().split("\n");
    assert.ok(lines.length >= 2, c.text());
    assert.doesNotMatch(c.text(), /\r|\x1b/);
    assert.match(lines[0], /^bench: 3\/10 done, ok 3, errors 0/);
    assert.match(lines[lines.length - 1], /^bench: 10\/10 done/);
  });
});
