import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { RequestAbort, toAbortSignal } from "../../src/util/abort.ts";

describe("RequestAbort (the server's per-request abort)", () => {
  it("runs each listener once, in order, with an AbortError reason; removed and late ones are not run", () => {
    const a = new RequestAbort();
    const seen: string[] = [];
    const one = () => seen.push("one");
    const two = () => seen.push("two");
    const gone = () => seen.push("gone");
    a.addEventListener("abort", one);
    a.addEventListener("abort", gone);
    a.addEventListener("abort", () => {
      throw new Error("a failing listener");
    });
    a.addEventListener("abort", two);
    a.removeEventListener("abort", gone);
    assert.equal(a.aborted, false);
    a.abort();
    a.abort();
    assert.deepEqual(seen, ["one", "two"]);
    assert.equal(a.aborted, true);
    assert.equal((a.reason as Error).name, "AbortError");
    a.addEventListener("abort", () => seen.push("late"));
    assert.deepEqual(seen, ["one", "two"]);
  });

  it("keeps a given reason; toAbortSignal follows it before and after the abort", () => {
    const a = new RequestAbort();
    const before = toAbortSignal(a);
    assert.equal(toAbortSignal(a), before, "made once");
    assert.equal(before.aborted, false);
    const why = new Error("client went away");
    a.abort(why);
    assert.equal(before.aborted, true);
    assert.equal(before.reason, why);
    const b = new RequestAbort();
    b.abort(why);
    assert.equal(toAbortSignal(b).reason, why);
    const real = new AbortController().signal;
    assert.equal(toAbortSignal(real), real);
  });
});
