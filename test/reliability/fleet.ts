/**
 * Real `infera engine sim` launchers (each in its own process group, so a kill -9 of the
 * group takes the launcher and its engine down together) registering in a real etcd.
 */
import type { ChildProcess } from "node:child_process";
import { spawnInfera } from "../helpers/infera.ts";
import { engineListenArgs } from "../helpers/launcher.ts";
import { freePort } from "../helpers/ports.ts";

export interface LaunchedWorker {
  id: string;
  proc: ChildProcess;
  port: number;
  url: string;
  exited: Promise<void>;
  output: () => string;
  /** SIGKILL to the whole process group (launcher + engine); no-op when gone. */
  killGroup(): void;
}

export interface LaunchOptions {
  id: string;
  etcd: string;
  prefix: string;
  leaseTtlS?: number;
  /** Extra launcher flags (e.g. NATS). */
  flags?: string[];
  /** Extra engine arguments (after --). */
  engineArgs?: string[];
  env?: Record<string, string>;
}

export async function launchWorker(o: LaunchOptions): Promise<LaunchedWorker> {
  const port = await freePort();
  const args = [
    "engine",
    "sim",
    "--model",
    "sim-model",
    "--worker-id",
    o.id,
    ...(await engineListenArgs(port)),
    "--etcd-endpoints",
    o.etcd,
    "--etcd-prefix",
    o.prefix,
    "--lease-ttl",
    String(o.leaseTtlS ?? 2),
    ...(o.flags ?? []),
    "--",
    ...(o.engineArgs ?? ["--speed", "1", "--seed", "1"]),
  ];
  const { proc, output } = spawnInfera(args, {
    logLevel: "warn",
    env: o.env,
    detached: true,
    stdout: true,
    keepChars: 8000,
  });
  const exited = new Promise<void>((resolve) => {
    if (proc.exitCode !== null) resolve();
    else proc.once("exit", () => resolve());
  });
  return {
    id: o.id,
    proc,
    port,
    url: `http://127.0.0.1:${port}`,
    exited,
    output,
    killGroup() {
      try {
        process.kill(-(proc.pid as number), "SIGKILL");
      } catch {
        // already gone
      }
    },
  };
}
