/**
 * `bench/fleet-routing/run.ts --help` prints the usage (the file's header comment) and exits 0
 * without starting anything; before it, any invocation started a 15-minute run.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const RUN = fileURLToPath(new URL("../../bench/fleet-routing/run.ts", import.meta.url));

test("fleet-routing --help prints the usage and starts nothing", () => {
  // The bound only keeps a regression (a real run) from hanging the suite.
  const r = spawnSync(process.execPath, [RUN, "--help"], { encoding: "utf8", timeout: 60_000 });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^Fleet routing under load/);
  assert.match(r.stdout, /\n {2}node bench\/fleet-routing\/run\.ts \[--quick\] \[--workers 8,16\]/);
  assert.doesNotMatch(r.stdout, /^ \*/m, "comment markers stripped");
  // The runner logs to stderr from its first step on: none ran.
  assert.doesNotMatch(r.stderr, /\[fleet-routing/);
});
