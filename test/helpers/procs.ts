/**
 * Every process a test helper spawns is registered here, so that none outlives its test file.
 * A child that is still running keeps the test file's event loop alive: `node --test` then
 * waits on that file for ever, and CI hangs instead of failing. Three nets, from the nearest:
 *
 * - `startedOrStopped(child, ready)`: a helper's start-up wait that throws (time-out, early exit,
 *   a lost port) stops the child it spawned (SIGTERM, SIGKILL after a short grace) before the
 *   error propagates, so a failed `before` leaks nothing.
 * - a root-level `after` hook, registered when this module is first imported by a test file,
 *   releases every tracked child still running once the file's tests are done (a test that
 *   threw before its own clean-up, a handle a test forgot): they no longer keep the file's
 *   process alive, so it exits once its own `after` hooks are done,
 * - and then `killOnExit` (src/util/child-process.ts) SIGKILLs them from the 'exit' event.
 *
 * Benches import some of these helpers too; they get the first and last nets, not the hook
 * (calling a node:test hook would start a test run inside the bench).
 */
import { type ChildProcess, type SpawnOptions, spawn } from "node:child_process";
import { after } from "node:test";
import { isRunning, killOnExit, stopChild } from "../../src/util/child-process.ts";

/** SIGTERM grace for a child whose start failed or that a file left behind. */
export const ABANDON_GRACE_MS = 1000;

const tracked = new Set<ChildProcess>();

/** Registers `child` (SIGKILLed at process exit, stopped by the file's root `after`); returns it. */
export function track<C extends ChildProcess>(child: C): C {
  killOnExit(child);
  if (isRunning(child)) {
    tracked.add(child);
    child.once("exit", () => tracked.delete(child));
  }
  return child;
}

/** `spawn`, tracked. */
export function spawnTracked(cmd: string, args: readonly string[], opts: SpawnOptions): ChildProcess {
  return track(spawn(cmd, args, opts));
}

/** SIGTERM, SIGKILL after `graceMs`; resolves once `child` exited. */
export function abandon(child: ChildProcess, graceMs = ABANDON_GRACE_MS): Promise<void> {
  return stopChild(child, graceMs);
}

/**
 * Awaits `ready()` (a helper's start-up wait); if it throws, stops `child` (and waits for its
 * exit) before rethrowing, so a start that failed or timed out leaves no process behind.
 */
export async function startedOrStopped<T>(child: ChildProcess, ready: () => Promise<T>): Promise<T> {
  try {
    return await ready();
  } catch (err) {
    await abandon(child);
    throw err;
  }
}

/** Stops every tracked child still running; returns how many there were. */
export async function stopLeftovers(): Promise<number> {
  const left = [...tracked].filter(isRunning);
  await Promise.all(left.map((c) => abandon(c)));
  return left.length;
}

/** The pids of the tracked children still running (for tests of this module). */
export function runningPids(): number[] {
  return [...tracked].filter(isRunning).map((c) => c.pid as number);
}

/**
 * Lets this process exit although `child` still runs: the child and its stdio pipes no longer
 * hold the event loop open. The 'exit' hook of `killOnExit` then SIGKILLs it.
 */
/** How long the file's own `after` hooks get to stop their children before the rest are released. */
const RELEASE_GRACE_MS = 10_000;

function release(child: ChildProcess): void {
  child.unref();
  for (const s of [child.stdin, child.stdout, child.stderr]) (s as { unref?: () => void } | null)?.unref?.();
}

// `node --test` runs each file in a process with NODE_TEST_CONTEXT set; a file run directly
// (`node x.test.ts`) is recognised by its name. Registered when this module is first imported,
// the hook is the root's and the first of the file's root `after` hooks, so it must not stop
// anything: the file's own clean-up still needs its processes (stopping a nats-server under a
// client not yet closed made that client write after end). It only releases what is still
// tracked; once the file's hooks are done and nothing else is pending the process exits, and
// the exit hook kills the leftovers.
if (process.env.NODE_TEST_CONTEXT !== undefined || /\.test\.[cm]?[jt]s$/.test(process.argv[1] ?? "")) {
  after(() => {
    // Not at once: the file's own `after` hooks run next and may await these children's exit.
    // Released children no longer hold the event loop, so the process would end in the middle of
    // such a hook and skip what follows it (the reliability files' `fileDone()`: the summary then
    // failed them as "no figure"). The timer is unref'd: when the file's clean-up ends its
    // children in time it never fires; when a forgotten child keeps the process alive, it fires
    // and releases that child, and the exit hook kills it.
    setTimeout(() => {
      for (const c of tracked) if (isRunning(c)) release(c);
    }, RELEASE_GRACE_MS).unref();
  });
}
