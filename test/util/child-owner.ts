/**
 * A parent for test/util/child-process-orphans.test.ts: owns one child through killOnExit and
 * handleFatalSignals, prints "child <pid>" on stderr, then waits to be killed.
 *
 *   node test/util/child-owner.ts MODE
 *   MODE: wait (until a signal) | stubborn (the child ignores SIGTERM; 300 ms grace)
 *       | epipe (writes to stdout until its reader is gone) | throw (an uncaught exception)
 */
import { spawn } from "node:child_process";
import { handleFatalSignals, killOnExit } from "../../src/util/child-process.ts";

const mode = process.argv[2] ?? "wait";
const child = killOnExit(
  mode === "stubborn"
    ? spawn(process.execPath, ["-e", 'process.on("SIGTERM", () => {}); setInterval(() => {}, 1000)'], {
        stdio: "ignore",
      })
    : spawn("sleep", ["60"], { stdio: "ignore" }),
);
handleFatalSignals(mode === "stubborn" ? 300 : undefined);
// The stubborn child must have its SIGTERM handler before it is signalled.
if (mode === "stubborn") await new Promise((r) => setTimeout(r, 500));
process.stderr.write(`child ${child.pid}\n`);
if (mode === "throw")
  setTimeout(() => {
    throw new Error("boom");
  }, 50);
if (mode === "epipe") setInterval(() => process.stdout.write("line\n"), 20);
else setInterval(() => {}, 1000);
