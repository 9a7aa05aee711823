/**
 * test/helpers/procs.ts and the spawn helpers that use it: a start that fails or times out
 * leaves no process behind, and a test file that forgets a child still ends (its root `after`
 * hook stops the child) instead of hanging `node --test`.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { spawnKvd, tempDir } from "../kvd/helpers.ts";
import { startKvdProcess } from "../kvd/preauth-helpers.ts";
import { startEtcd } from "./etcd.ts";
import { startNats } from "./nats.ts";
import { runningPids, spawnTracked, stopLeftovers } from "./procs.ts";
import { startSim } from "./sim.ts";

/** Whether `pid` names a live process (a zombie, ended but not reaped, counts as gone). */
function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

/** Live processes whose parent is this one. */
function livingChildren(): number[] {
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      // pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren.
      const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(ppid) === process.pid && state !== "Z") out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

describe("a spawn helper whose start times out leaves no process", () => {
  // Each start gets 1 ms: none of these processes can be ready that soon, so every start
  // fails after its child was spawned, and the child must be gone when the error arrives.
  const cases: Array<[string, () => Promise<unknown>]> = [
    ["startSim", () => startSim({ timeoutMs: 1 })],
    ["startEtcd", () => startEtcd({ timeoutMs: 1 })],
    ["startNats", () => startNats({ timeoutMs: 1 })],
    [
      "spawnKvd",
      async () => {
        const { dir, cleanup } = tempDir();
        try {
          return await spawnKvd(
            ["--socket", join(dir, "kvd.sock"), "--ram-bytes", "16MiB", "--ephemeral"],
            join(dir, "kvd.sock"),
            1,
          );
        } finally {
          cleanup();
        }
      },
    ],
    [
      "startKvdProcess",
      async () => {
        const { dir, cleanup } = tempDir();
        try {
          return await startKvdProcess(dir, [], undefined, 1);
        } finally {
          cleanup();
        }
      },
    ],
  ];
  for (const [name, start] of cases) {
    test(name, async () => {
      assert.deepEqual(livingChildren(), [], "no child before the start");
      await assert.rejects(start(), /in time|healthy|not ready|timed out/);
      assert.deepEqual(livingChildren(), [], `${name} left its process running`);
      assert.deepEqual(runningPids(), []);
    });
  }
});

test("stopLeftovers stops what a test left running", async () => {
  const child = spawnTracked("sleep", ["300"], { stdio: "ignore" });
  const pid = child.pid as number;
  assert.ok(alive(pid));
  assert.equal(await stopLeftovers(), 1);
  assert.equal(alive(pid), false);
});

/** Runs a fixture test file with `node --test`; its exit, output and the child pid it printed. */
async function runFixture(
  name: string,
): Promise<{ code: number | null; signal: string | null; out: string; pid: number }> {
  // Without this file's NODE_TEST_CONTEXT, which makes a nested `node --test` skip its files.
  const { NODE_TEST_CONTEXT: _, ...env } = process.env;
  const run = spawn(
    process.execPath,
    ["--test", "--test-reporter=tap", join(import.meta.dirname, "fixtures", name)],
    {
      stdio: ["ignore", "pipe", "pipe"],
      env,
    },
  );
  let out = "";
  run.stdout.on("data", (d: Buffer) => {
    out += d.toString();
  });
  run.stderr.on("data", (d: Buffer) => {
    out += d.toString();
  });
  // Generous for a loaded box; without the hook the run never ends at all.
  const killer = setTimeout(() => run.kill("SIGKILL"), 60_000);
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((r) =>
    run.once("exit", (c, s) => r([c, s])),
  );
  clearTimeout(killer);
  const pid = Number(/LEAKED_PID=(\d+)/.exec(out)?.[1]);
  if (pid > 0 && alive(pid)) process.kill(pid, "SIGKILL");
  return { code, signal, out, pid };
}

test("a test file that forgets a tracked child ends, and the child with it", async () => {
  const { code, signal, out, pid } = await runFixture("leaky.fixture.ts");
  assert.equal(signal, null, `the fixture's run hung and was killed:\n${out}`);
  assert.equal(code, 0, out);
  assert.ok(pid > 0, out);
  assert.equal(alive(pid), false, "the forgotten child still runs");
});

test("a file's own after hooks still find its tracked children running", async () => {
  const { code, signal, out, pid } = await runFixture("order.fixture.ts");
  assert.equal(signal, null, `the fixture's run hung and was killed:\n${out}`);
  assert.equal(code, 0, out);
  assert.match(out, /OWN_AFTER_SAW_CHILD_RUNNING/);
  assert.equal(alive(pid), false, "the child outlived the file");
});
