import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { test } from "node:test";
import { isRunning, killChild, stopChild } from "../../src/util/child-process.ts";

/** A node child that prints "ready" once its handlers are in place. */
function nodeChild(code: string) {
  const child = spawn(
    process.execPath,
    ["-e", `${code}; console.log("ready"); setInterval(() => {}, 1000)`],
    {
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const ready = once(child.stdout, "data");
  return { child, ready };
}

test("stopChild: a child that honours SIGTERM ends by it", async () => {
  const { child, ready } = nodeChild("");
  await ready;
  assert.equal(isRunning(child), true);
  await stopChild(child, 60_000);
  assert.equal(child.signalCode, "SIGTERM");
  assert.equal(isRunning(child), false);
});

test("stopChild: a child that ignores SIGTERM is SIGKILLed after the grace period", async () => {
  const { child, ready } = nodeChild('process.on("SIGTERM", () => {})');
  await ready;
  await stopChild(child, 300);
  assert.equal(child.signalCode, "SIGKILL");
});

test("stopChild and killChild return at once for a child already ended by a signal", async () => {
  const { child, ready } = nodeChild("");
  await ready;
  child.kill("SIGKILL");
  await once(child, "exit");
  // Its exit code is null: a check of exitCode alone would wait for an 'exit' that never comes.
  assert.equal(child.exitCode, null);
  await stopChild(child);
  killChild(child);
  assert.equal(child.signalCode, "SIGKILL");
});
