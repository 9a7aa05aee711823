import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { describe, it } from "node:test";

describe("streaming pump backpressure", () => {
  it("pauses the upstream body while the client socket is full, resumes on drain", async () => {
    const { PassThrough } = await import("node:stream");
    const { pump } = await import("../../src/server/proxy.ts");
    const body = new PassThrough();
    const res = new EventEmitter() as EventEmitter & { full: boolean };
    res.full = true;
    const seen: string[] = [];
    const done = pump(body, res as never, (c) => {
      seen.push(c.toString());
      return !res.full;
    });
    body.write("a");
    body.write("b");
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(seen, ["a"], "nothing more is read while the client is not draining");
    assert.equal(body.isPaused(), true);
    res.full = false;
    res.emit("drain");
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(seen, ["a", "b"]);
    body.end("c");
    await done;
    assert.deepEqual(seen, ["a", "b", "c"]);
  });

  it("rejects when the upstream body is destroyed mid-way", async () => {
    const { PassThrough } = await import("node:stream");
    const { pump } = await import("../../src/server/proxy.ts");
    const body = new PassThrough();
    const done = pump(body, null, () => true);
    body.write("x");
    body.destroy(new Error("reset"));
    await assert.rejects(done, /reset/);
  });
});
