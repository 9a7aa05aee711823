/** `bin/infera.js` run as a child process the way the process-level tests run it. */
import type { ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { stopChild } from "../../src/util/child-process.ts";
import { spawnTracked } from "./procs.ts";
import { waitUntil } from "./wait.ts";

export const INFERA_BIN = fileURLToPath(new URL("../../bin/infera.js", import.meta.url));

/** `infera server` on loopback at `port`, followed by `rest`: the start of every server command line here. */
export function serverArgs(port: number, ...rest: string[]): string[] {
  return ["server", "--host", "127.0.0.1", "--port", String(port), ...rest];
}

export interface SpawnInferaOptions {
  /** INFERA_LOG_LEVEL for the child. */
  logLevel: string;
  /** More environment (after INFERA_LOG_LEVEL, so it may override it). */
  env?: Record<string, string>;
  /** Own process group, so a kill of -pid takes the children it starts too. */
  detached?: boolean;
  /** Capture stdout as well as stderr (stdout is ignored otherwise). */
  stdout?: boolean;
  /** Keep only the last this many characters of output (all of it when absent). */
  keepChars?: number;
}

export function spawnInfera(
  args: string[],
  o: SpawnInferaOptions,
): { proc: ChildProcess; output: () => string } {
  const proc = spawnTracked(process.execPath, [INFERA_BIN, ...args], {
    detached: o.detached,
    stdio: ["ignore", o.stdout ? "pipe" : "ignore", "pipe"],
    env: { ...process.env, INFERA_LOG_LEVEL: o.logLevel, ...o.env },
  });
  let out = "";
  const keep = (d: Buffer) => {
    out = o.keepChars === undefined ? out + d.toString() : (out + d.toString()).slice(-o.keepChars);
  };
  proc.stdout?.on("data", keep);
  proc.stderr?.on("data", keep);
  return { proc, output: () => out };
}

/**
 * The exit code of `proc`, or "still running" (then stopped) after `ms`: for a command that must
 * exit at once (a refused flag), where one that took its input would run for ever.
 */
export async function exitWithin(proc: ChildProcess, ms: number): Promise<number | string | null> {
  const code = await new Promise<number | string | null>((r) => {
    const t = setTimeout(() => r("still running"), ms);
    proc.on("exit", (c) => {
      clearTimeout(t);
      r(c);
    });
  });
  if (code === "still running") await stopChild(proc, 1000);
  return code;
}

/**
 * Waits (polling /ready) until the server at `url` routes to `workers` workers; throws with its
 * output if it exits first. Generous by default: the shared box runs other suites meanwhile.
 */
export async function waitReadyWorkers(
  url: string,
  proc: ChildProcess,
  output: () => string,
  workers: number,
  timeoutMs = 90_000,
): Promise<void> {
  await waitUntil(
    async () => {
      if (proc.exitCode !== null) throw new Error(`server exited ${proc.exitCode}: ${output()}`);
      try {
        const r = await fetch(`${url}/ready`);
        return r.ok && ((await r.json()) as { workers: number }).workers === workers;
      } catch {
        return false;
      }
    },
    timeoutMs,
    "server ready",
    50,
  );
}
