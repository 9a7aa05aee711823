import assert from "node:assert/strict";
import { test } from "node:test";
import { ContextLengthError, NoWorkerError, toInferaError } from "../src/protocol/errors.ts";

test("errors serialise in OpenAI's shape with status and headers", () => {
  const e = new NoWorkerError("m", 2);
  assert.equal(e.status, 503);
  assert.equal(e.headers["retry-after"], "2");
  assert.deepEqual(Object.keys(e.toJSON().error).sort(), ["code", "message", "param", "type"]);
  const c = new ContextLengthError(100, 20, 64);
  assert.equal(c.status, 400);
  assert.equal(c.toJSON().error.code, "context_length_exceeded");
  assert.equal(toInferaError(new Error("secret internals")).toJSON().error.message, "Internal server error.");
});
