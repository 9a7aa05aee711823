/**
 * Starts a real single-member etcd (/usr/bin/etcd) on free loopback ports with a temp data
 * dir, for tests and benchmarks. `stop()` (SIGTERM) / `kill()` (SIGKILL) simulate an outage;
 * `restart()` brings it back on the same ports and data, so leases and keys survive as they
 * would in production.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "./ports.ts";

export interface EtcdHandle {
  /** `http://127.0.0.1:<client port>` */
  endpoint: string;
  clientPort: number;
  dataDir: string;
  /** Graceful stop (SIGTERM); resolves once the process exited. */
  stop(): Promise<void>;
  /** Hard stop (SIGKILL). */
  kill(): Promise<void>;
  /** Starts it again on the same ports and data dir; resolves once it answers. */
  restart(): Promise<void>;
  /** Stops it and removes the data dir. */
  dispose(): Promise<void>;
}

const ETCD_BIN = process.env.INFERA_ETCD_BIN ?? "/usr/bin/etcd";

async function waitHealthy(endpoint: string, timeoutMs: number, proc: ChildProcess): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`etcd exited with ${proc.exitCode} before it was healthy`);
    try {
      const res = await fetch(`${endpoint}/health`, { signal: AbortSignal.timeout(500) });
      if (res.ok) {
        const body = (await res.json()) as { health?: string };
        if (body.health === "true") return;
      }
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`etcd at ${endpoint} not healthy after ${timeoutMs} ms`);
}

function exited(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => proc.once("exit", () => resolve()));
}

export async function startEtcd(opts: { timeoutMs?: number } = {}): Promise<EtcdHandle> {
  const clientPort = await freePort();
  const peerPort = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), "infera-etcd-"));
  const endpoint = `http://127.0.0.1:${clientPort}`;
  const peer = `http://127.0.0.1:${peerPort}`;
  let proc: ChildProcess | null = null;

  const launch = async (): Promise<void> => {
    const p = spawn(
      ETCD_BIN,
      [
        "--name",
        "infera-test",
        "--data-dir",
        dataDir,
        "--listen-client-urls",
        endpoint,
        "--advertise-client-urls",
        endpoint,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        `infera-test=${peer}`,
        "--log-level",
        "error",
        "--logger",
        "zap",
      ],
      { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ETCD_UNSUPPORTED_ARCH: process.arch } },
    );
    let stderr = "";
    p.stderr?.on("data", (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    proc = p;
    try {
      await waitHealthy(endpoint, opts.timeoutMs ?? 15_000, p);
    } catch (err) {
      p.kill("SIGKILL");
      throw new Error(`${(err as Error).message}\n${stderr}`);
    }
  };

  const halt = async (signal: NodeJS.Signals): Promise<void> => {
    const p = proc;
    proc = null;
    if (!p) return;
    p.kill(signal);
    await exited(p);
  };

  await launch();
  return {
    endpoint,
    clientPort,
    dataDir,
    stop: () => halt("SIGTERM"),
    kill: () => halt("SIGKILL"),
    restart: async () => {
      await halt("SIGTERM");
      await launch();
    },
    dispose: async () => {
      await halt("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
