/**
 * Test ports are claimed across processes (test/helpers/ports.ts): the runner runs test files
 * in parallel, and two of them picking the same random port between a check and a child's
 * bind made an engine fail with EADDRINUSE (stop 35's CI).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { claimPort, freePort, freePortRun, isPortRace } from "./ports.ts";

const PORTS = fileURLToPath(new URL("./ports.ts", import.meta.url));

/** Runs `code` in another Node process with `claimPort` and `freePort` in scope; its stdout. */
function inChild(code: string): string {
  return execFileSync(
    process.execPath,
    ["--input-type=module", "-e", `import { claimPort, freePort } from ${JSON.stringify(PORTS)};\n${code}`],
    { encoding: "utf8" },
  ).trim();
}

test("a port another process handed out is not handed out again", async () => {
  const theirs = Number(inChild("console.log(await freePort());"));
  assert.ok(theirs >= 15000 && theirs < 32000, String(theirs));
  assert.equal(claimPort(theirs), false, "claimed by the other process");
  const mine = await freePort();
  assert.notEqual(mine, theirs);
  assert.equal(inChild(`console.log(claimPort(${mine}));`), "false", "and mine is not theirs");
});

test("a run of consecutive ports is claimed whole", async () => {
  const base = await freePortRun(4);
  for (let p = base; p < base + 4; p++) assert.equal(claimPort(p), false, `port ${p} claimed`);
  assert.equal(
    inChild(`console.log([0, 1, 2, 3].map((k) => claimPort(${base} + k)).join(","));`),
    "false,false,false,false",
  );
});

test("an EADDRINUSE by any spelling is a port race", () => {
  assert.equal(isPortRace(new Error("listen EADDRINUSE: address already in use 127.0.0.1:1")), true);
  // libzmq's strerror, as the zeromq binding reports a bind failure.
  assert.equal(isPortRace(new Error("Address already in use")), true);
  assert.equal(isPortRace(new Error("connect ECONNREFUSED 127.0.0.1:1")), false);
});
