/**
 * Stopping a child process: SIGTERM, and SIGKILL if it has not exited after a grace period.
 * The one copy of what `infera up`, the test helpers and the benches each wrote out before.
 * The checks read both `exitCode` and `signalCode`: a child ended by a signal has a null exit
 * code, and waiting for the 'exit' event of one already gone never resolves.
 */
import type { ChildProcess } from "node:child_process";

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
