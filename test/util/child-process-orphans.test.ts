/**
 * A runner that dies by SIGINT, SIGTERM or SIGHUP, by a broken stdout (EPIPE, as with
 * `| head`) or by an uncaught exception takes its children along (src/util/child-process.ts
 * killOnExit + handleFatalSignals, as the bench runners use them). test/util/child-owner.ts is
 * the parent; each case kills it one way and checks that its child's pid is gone.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const OWNER = fileURLToPath(new URL("./child-owner.ts", import.meta.url));

/** No such process, or a zombie (dead, waiting for its new parent to reap it). */
function gone(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ESRCH") return true;
    throw err;
  }
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0] === "Z";
  } catch {
    return true;
  }
}

/** Polls until `pid` is gone; false if it is still there after `limitMs` (a bound, not a timing check). */
async function waitGone(pid: number, limitMs = 15_000): Promise<boolean> {
  const until = Date.now() + limitMs;
  while (Date.now() < until) {
    if (gone(pid)) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return gone(pid);
}

/** Starts the owner, waits for its child's pid, ends it with `kill`; returns its exit and the child. */
async function ownerDies(
  mode: string,
  kill: (owner: ReturnType<typeof spawn>) => void,
): Promise<{ code: number | null; childPid: number; stderr: string }> {
  const owner = spawn(process.execPath, [OWNER, mode], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  const childPid = await new Promise<number>((resolve, reject) => {
    owner.stderr.on("data", (d: Buffer) => {
      stderr += d.toString();
      const m = /child (\d+)/.exec(stderr);
      if (m) resolve(Number(m[1]));
    });
    owner.once("exit", () => reject(new Error(`owner exited early: ${stderr}`)));
  });
  assert.equal(gone(childPid), false, "the child runs while its owner does");
  const exited = new Promise<number | null>((r) => owner.once("exit", (code) => r(code)));
  kill(owner);
  const code = await exited;
  return { code, childPid, stderr };
}

for (const [sig, code] of [
  ["SIGTERM", 143],
  ["SIGINT", 130],
  ["SIGHUP", 129],
] as const) {
  test(`${sig} to the owner stops its child, and the owner exits ${code}`, async () => {
    const r = await ownerDies("wait", (o) => o.kill(sig));
    assert.equal(r.code, code, r.stderr);
    assert.ok(await waitGone(r.childPid), `child ${r.childPid} still running`);
  });
}

test("a child that ignores SIGTERM is SIGKILLed after the grace period", async () => {
  const r = await ownerDies("stubborn", (o) => o.kill("SIGTERM"));
  assert.equal(r.code, 143, r.stderr);
  assert.ok(await waitGone(r.childPid), `child ${r.childPid} still running`);
});

test("a closed stdout pipe (EPIPE) ends the owner and its child", async () => {
  const r = await ownerDies("epipe", (o) => o.stdout?.destroy());
  assert.equal(r.code, 1, r.stderr);
  assert.ok(await waitGone(r.childPid), `child ${r.childPid} still running`);
});

test("an uncaught exception in the owner kills its child from the exit hook", async () => {
  const r = await ownerDies("throw", () => {});
  assert.equal(r.code, 1);
  assert.match(r.stderr, /boom/);
  assert.ok(await waitGone(r.childPid), `child ${r.childPid} still running`);
});
