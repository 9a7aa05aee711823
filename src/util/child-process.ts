/**
 * Child processes: stopping one (SIGTERM, and SIGKILL if it has not exited after a grace
 * period), and not leaving them behind when their parent dies. The one copy of what
 * `infera up`, the test helpers and the benches each wrote out before. The checks read both
 * `exitCode` and `signalCode`: a child ended by a signal has a null exit code, and waiting for
 * the 'exit' event of one already gone never resolves.
 *
 * A parent that dies leaves its children running unless it kills them itself: `killOnExit`
 * registers a child to be SIGKILLed from the process's 'exit' event, and `handleFatalSignals`
 * turns the deaths that skip that event (SIGINT, SIGTERM, SIGHUP, whose default action ends the
 * process at once) and a broken stdout or stderr (EPIPE: the reader went away, as with
 * `| head`) into an orderly exit that stops the registered children first. Only SIGKILL of the
 * parent still orphans them.
 */
import type { ChildProcess } from "node:child_process";
import { constants } from "node:os";

/** How long `stopChild` waits after SIGTERM before SIGKILL, by default. */
export const STOP_GRACE_MS = 5000;

/** Whether `child` was started and has neither exited nor been ended by a signal. */
export function isRunning(child: ChildProcess): boolean {
  return child.pid !== undefined && child.exitCode === null && child.signalCode === null;
}

/** SIGKILL, unless it is gone already. */
export function killChild(child: ChildProcess): void {
  if (isRunning(child)) child.kill("SIGKILL");
}

/** SIGTERM, then SIGKILL if it is still running after `graceMs`; resolves once it exited. */
export async function stopChild(child: ChildProcess, graceMs = STOP_GRACE_MS): Promise<void> {
  if (!isRunning(child)) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  child.kill("SIGTERM");
  const t = setTimeout(() => killChild(child), graceMs);
  await exited;
  clearTimeout(t);
}

/** Children to kill if this process exits while they run (see `killOnExit`). */
const owned = new Set<ChildProcess>();
let exitHooked = false;

/**
 * Registers `child` to be SIGKILLed if this process exits while it still runs. The 'exit'
 * event allows synchronous code only, hence SIGKILL without a grace period; the orderly paths
 * (`stopChild`, `handleFatalSignals`) give the child its SIGTERM first. Returns `child`.
 */
export function killOnExit<C extends ChildProcess>(child: C): C {
  if (!exitHooked) {
    exitHooked = true;
    process.on("exit", () => {
      for (const c of owned) killChild(c);
    });
  }
  if (!isRunning(child)) return child;
  owned.add(child);
  child.once("exit", () => owned.delete(child));
  return child;
}

const FATAL_SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
let fatalHandled = false;

/**
 * For a process that owns children (a bench runner): on SIGINT, SIGTERM or SIGHUP, stops every
 * child `killOnExit` registered (SIGTERM, SIGKILL after `graceMs`) and exits with 128 + the
 * signal's number; a second signal meanwhile exits at once (the 'exit' hook SIGKILLs the rest).
 * An error on stdout or stderr (EPIPE) does the same with exit code 1: nothing can report the
 * run any more, and unhandled it would crash the process with an uncaught exception. Installed
 * once; later calls do nothing.
 */
export function handleFatalSignals(graceMs = STOP_GRACE_MS): void {
  if (fatalHandled) return;
  fatalHandled = true;
  let ending = false;
  const end = (code: number): void => {
    if (ending) return;
    ending = true;
    void Promise.all([...owned].map((c) => stopChild(c, graceMs))).finally(() => process.exit(code));
  };
  for (const sig of FATAL_SIGNALS) {
    const code = 128 + constants.signals[sig];
    process.on(sig, () => (ending ? process.exit(code) : end(code)));
  }
  for (const stream of [process.stdout, process.stderr]) stream.on("error", () => end(1));
}
