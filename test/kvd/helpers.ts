import type { ChildProcess } from "node:child_process";
import { createCipheriv, createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type KvdDaemon, startKvd } from "../../src/kvd/daemon.ts";
import type { KvdConfig } from "../../src/kvd/types.ts";
import { createLogger } from "../../src/util/log.ts";
import { spawnTracked, startedOrStopped } from "../helpers/procs.ts";

export const MiB = 1024 * 1024;

/** How many chunk files the disk tier under `diskDir` holds (files in its two-hex-digit shard folders). */
export function chunkFilesOnDisk(diskDir: string): number {
  return readdirSync(diskDir)
    .filter((n) => /^[0-9a-f]{2}$/.test(n))
    .reduce((s, d) => s + readdirSync(join(diskDir, d)).length, 0);
}

export function tempDir(prefix = "kvd-test-"): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * Deterministic bytes for a key, so any reader can verify what it got: the AES-256-CTR stream
 * keyed by sha256(key), so different keys give different bytes and a shorter size is a prefix
 * of a longer one. (A sha256 chain, one hash per 32 bytes, cost ≈ 40 ms of CPU per MiB; the
 * tests that move tens of MiB spent most of their time here. The stream costs ≈ 1 ms per MiB.)
 */
export function bytesFor(key: string, size: number): Buffer {
  const k = createHash("sha256").update(key).digest();
  return createCipheriv("aes-256-ctr", k, Buffer.alloc(16)).update(Buffer.alloc(size));
}

export async function startTestKvd(dir: string, cfg: Partial<KvdConfig> = {}): Promise<KvdDaemon> {
  return startKvd(
    {
      socketPath: join(dir, "kvd.sock"),
      ramBytes: 16 * MiB,
      diskDir: join(dir, "disk"),
      diskBytes: 64 * MiB,
      sweepMs: 50,
      ...cfg,
    },
    createLogger("kvd-test", {}).child({}, { level: process.env.INFERA_LOG_LEVEL ?? "silent" }),
  );
}

function canConnect(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(path, () => {
      s.destroy();
      resolve(true);
    });
    s.on("error", () => resolve(false));
  });
}

/** How long a spawned `infera kvd` may take to accept connections (node start-up on a loaded box). */
export const KVD_START_MS = 30_000;

/**
 * Runs `infera kvd` as a child process; resolves once its socket accepts connections. A start
 * that fails or times out stops the process before it throws (see test/helpers/procs.ts).
 */
export async function spawnKvd(
  args: string[],
  socketPath: string,
  timeoutMs = KVD_START_MS,
): Promise<ChildProcess> {
  const child = spawnTracked(
    process.execPath,
    [join(import.meta.dirname, "../../bin/infera.js"), "kvd", ...args],
    {
      env: { ...process.env, INFERA_LOG_LEVEL: "warn" },
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  const deadline = Date.now() + timeoutMs;
  await startedOrStopped(child, async () => {
    while (!existsSync(socketPath) || !(await canConnect(socketPath))) {
      if (child.exitCode !== null) throw new Error(`kvd exited with ${child.exitCode}`);
      if (Date.now() > deadline) throw new Error("kvd did not create its socket in time");
      await new Promise((r) => setTimeout(r, 50));
    }
  });
  return child;
}

export function waitExit(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once("exit", () => resolve());
  });
}

const PY = process.env.PYTHON ?? "python3";
/** The repository root (for python/ and test/kvd/py/ scripts). */
export const REPO_ROOT = join(import.meta.dirname, "../..");

/** Runs a Python script with `python3` (or $PYTHON), killed after 30 s; its exit code and output. */
export function runPython(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawnTracked(PY, args, { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    p.stdout?.on("data", (d) => {
      stdout += d;
    });
    p.stderr?.on("data", (d) => {
      stderr += d;
    });
    const t = setTimeout(() => p.kill("SIGKILL"), 30000);
    p.on("close", (code) => {
      clearTimeout(t);
      resolve({ code, stdout, stderr });
    });
  });
}
