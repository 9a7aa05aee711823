/** Shared by the fleet tests: a fleet as a child process, a KV-event collector. */
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Unpackr } from "msgpackr";
import { Dealer, Subscriber } from "zeromq";
import type { FleetManifest } from "../../../src/engine/sim/fleet.ts";
import { stopChild } from "../../../src/util/child-process.ts";
import { serverArgs } from "../../helpers/infera.ts";
import { freePort } from "../../helpers/ports.ts";
import { spawnTracked } from "../../helpers/procs.ts";

const SIM_BIN = fileURLToPath(new URL("../../../bin/infera-sim.js", import.meta.url));
const unpackr = new Unpackr({ int64AsType: "bigint", useRecords: false, mapsAsObjects: true });

export interface FleetProcess {
  proc: ChildProcess;
  manifest: FleetManifest;
  output(): string;
  stop(): Promise<number | null>;
}

/** `infera-sim --fleet N --fleet-manifest F <args>` as a child; resolves once F is written. */
export async function spawnFleet(count: number, args: string[], timeoutMs = 60_000): Promise<FleetProcess> {
  const dir = mkdtempSync(join(tmpdir(), "infera-fleet-"));
  const file = join(dir, "manifest.json");
  const proc = spawnTracked(
    process.execPath,
    [SIM_BIN, "--fleet", String(count), "--fleet-manifest", file, ...args],
    { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, INFERA_LOG_LEVEL: "info" } },
  );
  let out = "";
  const keep = (b: Buffer) => {
    out = (out + b.toString()).slice(-20000);
  };
  proc.stdout?.on("data", keep);
  proc.stderr?.on("data", keep);
  const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
  const stop = async (): Promise<number | null> => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
    const code = await exited;
    rmSync(dir, { recursive: true, force: true });
    return code;
  };
  const deadline = Date.now() + timeoutMs;
  while (!existsSync(file)) {
    if (proc.exitCode !== null) {
      await stop();
      throw new Error(`fleet exited (${proc.exitCode}) before its manifest:\n${out}`);
    }
    if (Date.now() > deadline) {
      proc.kill("SIGKILL");
      await stop();
      throw new Error(`fleet not up within ${timeoutMs} ms:\n${out}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const manifest = JSON.parse(readFileSync(file, "utf8")) as FleetManifest;
  return { proc, manifest, output: () => out, stop };
}

/** Every KV-event batch one SUB socket hears: each event's tag, in order. */
export class EventTags {
  readonly tags: string[] = [];
  private readonly sub = new Subscriber();
  constructor(endpoint: string) {
    this.sub.connect(endpoint);
    this.sub.subscribe();
    void this.loop();
  }
  private async loop(): Promise<void> {
    try {
      for await (const frames of this.sub) this.tags.push(...batchTags(frames[frames.length - 1]));
    } catch {
      // closed
    }
  }
  close(): void {
    this.sub.close();
  }
}

/** The event tags of one msgpack EventBatch (array or map layout). */
export function batchTags(payload: Buffer): string[] {
  const b = unpackr.unpack(payload) as unknown;
  const events = (Array.isArray(b) ? b[1] : (b as { events: unknown[] }).events) as unknown[];
  return events.map((e) => (Array.isArray(e) ? String(e[0]) : String((e as { type: unknown }).type)));
}

/** vLLM's replay: `[empty, start_seq]` to the ROUTER; batches until seq -1. */
export async function replay(endpoint: string, start = 0n): Promise<{ seq: bigint; tags: string[] }[]> {
  const d = new Dealer({ linger: 0, receiveTimeout: 5000 });
  d.connect(endpoint);
  try {
    const s = Buffer.alloc(8);
    s.writeBigUInt64BE(start);
    await d.send(["", s]);
    const out: { seq: bigint; tags: string[] }[] = [];
    for (;;) {
      const [, seqBuf, payload] = await d.receive();
      const seq = seqBuf.readBigInt64BE(0);
      if (seq === -1n) return out;
      out.push({ seq, tags: batchTags(payload) });
    }
  } finally {
    d.close();
  }
}

export async function waitUntil(pred: () => boolean | Promise<boolean>, ms: number, what: string) {
  const end = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

const INFERA_BIN = fileURLToPath(new URL("../../../bin/infera.js", import.meta.url));

export interface ServerProcess {
  url: string;
  output(): string;
  stop(): Promise<void>;
}

/** `infera server --discovery static --workers-file F` over `records`, once /ready answers. */
export async function startStaticServer(records: unknown[], args: string[] = []): Promise<ServerProcess> {
  const dir = mkdtempSync(join(tmpdir(), "infera-fleet-server-"));
  const file = join(dir, "workers.json");
  writeFileSync(file, JSON.stringify(records));
  const port = await freePort();
  const proc = spawnTracked(
    process.execPath,
    [
      INFERA_BIN,
      ...serverArgs(port),
      "--discovery",
      "static",
      "--workers-file",
      file,
      "--scrape-interval",
      "0",
      ...args,
    ],
    { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, INFERA_LOG_LEVEL: "warn" } },
  );
  let out = "";
  const keep = (b: Buffer) => {
    out = (out + b.toString()).slice(-20000);
  };
  proc.stdout?.on("data", keep);
  proc.stderr?.on("data", keep);
  const stop = async (): Promise<void> => {
    await stopChild(proc);
    rmSync(dir, { recursive: true, force: true });
  };
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (proc.exitCode !== null) {
      await stop();
      throw new Error(`infera server exited: ${out}`);
    }
    try {
      if ((await fetch(`${url}/ready`, { signal: AbortSignal.timeout(2000) })).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`infera server not ready: ${out}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return { url, output: () => out, stop };
}
