/**
 * The simulated workers of the benchmark: N engines, either as one `infera-sim --fleet N`
 * process (one event loop, N ports: the fleet contract) or, where this checkout has no fleet, as
 * N separate `infera-sim` processes. Either way: their URLs and KV-event endpoints (for the
 * servers' workers file), cache resets, per-engine /metrics, and the CPU time of the processes.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { isRunning, killChild, killOnExit, stopChild } from "../../src/util/child-process.ts";
import { startSim } from "../../test/helpers/sim.ts";

export interface Engine {
  url: string;
  kvEndpoint: string;
  replayEndpoint: string | null;
}

export interface Engines {
  mode: "fleet" | "processes";
  engines: Engine[];
  /** The processes that run the engines (one for a fleet). */
  pids: number[];
  close(): Promise<void>;
  /** Whether every engine process still runs; their recent output, for failure messages. */
  alive(): boolean;
  output(): string;
}

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BIN = join(ROOT, "bin/infera-sim.js");
/** Whether this checkout's sim has `--fleet` (src/engine/sim/fleet.ts, issue #19). */
export const FLEET_AVAILABLE = existsSync(join(ROOT, "src/engine/sim/fleet.ts"));

interface Manifest {
  pid: number;
  engines: Array<{
    index: number;
    url: string;
    port: number;
    kvRanks: Array<{ rank: number; endpoint: string; replayEndpoint: string | null }>;
  }>;
}

/** `count` engines with the given engine args (block size, pool, speed), as a fleet when possible. */
export async function startEngines(
  count: number,
  simArgs: readonly string[],
  o: { fleet?: boolean; timeoutMs?: number } = {},
): Promise<Engines> {
  const fleet = o.fleet ?? FLEET_AVAILABLE;
  return fleet
    ? startFleet(count, simArgs, o.timeoutMs ?? 120_000)
    : startProcesses(count, simArgs, o.timeoutMs);
}

/** A base port with `count` free ports above it (best effort: checked once, then used at once). */
async function freeRange(count: number): Promise<number> {
  const { createServer } = await import("node:net");
  const probe = (p: number) =>
    new Promise<boolean>((res) => {
      const s = createServer();
      s.once("error", () => res(false));
      s.listen(p, "127.0.0.1", () => s.close(() => res(true)));
    });
  for (let attempt = 0; attempt < 50; attempt++) {
    // Below the kernel's ephemeral range (32768+), where the engines' own HTTP ports come from.
    const base = 12000 + Math.floor(Math.random() * 20000);
    let ok = true;
    for (let i = 0; i < count && ok; i++) ok = await probe(base + i);
    if (ok) return base;
  }
  throw new Error(`no ${count} consecutive free ports`);
}

async function startFleet(count: number, simArgs: readonly string[], timeoutMs: number): Promise<Engines> {
  const dir = mkdtempSync(join(tmpdir(), "fleet-routing-"));
  const manifestFile = join(dir, "manifest.json");
  const kvBase = await freeRange(count);
  const replayBase = await freeRange(count);
  const kvCfg = {
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: `tcp://127.0.0.1:${kvBase}`,
    replay_endpoint: `tcp://127.0.0.1:${replayBase}`,
    topic: "kv-events",
  };
  const child: ChildProcess = spawn(
    process.execPath,
    [
      BIN,
      "serve",
      "sim-model",
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--fleet",
      String(count),
      "--fleet-manifest",
      manifestFile,
      "--kv-events-config",
      JSON.stringify(kvCfg),
      ...simArgs,
    ],
    { cwd: ROOT, env: { ...process.env, INFERA_LOG_LEVEL: "warn" }, stdio: ["ignore", "pipe", "pipe"] },
  );
  killOnExit(child);
  let out = "";
  const keep = (b: Buffer) => {
    out = (out + b.toString()).slice(-20000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const deadline = Date.now() + timeoutMs;
  let manifest: Manifest | null = null;
  while (!manifest) {
    if (child.exitCode !== null) throw new Error(`infera-sim --fleet exited with ${child.exitCode}: ${out}`);
    if (existsSync(manifestFile)) manifest = JSON.parse(readFileSync(manifestFile, "utf8")) as Manifest;
    else if (Date.now() > deadline) {
      killChild(child);
      throw new Error(`infera-sim --fleet wrote no manifest in time: ${out}`);
    } else await new Promise((r) => setTimeout(r, 100));
  }
  rmSync(dir, { recursive: true, force: true });
  const engines = manifest.engines
    .sort((a, b) => a.index - b.index)
    .map((e) => ({
      url: e.url,
      kvEndpoint: e.kvRanks[0].endpoint,
      replayEndpoint: e.kvRanks[0].replayEndpoint,
    }));
  return {
    mode: "fleet",
    engines,
    pids: [child.pid ?? manifest.pid],
    alive: () => isRunning(child),
    output: () => out,
    close: () => stopChild(child),
  };
}

async function startProcesses(
  count: number,
  simArgs: readonly string[],
  timeoutMs = 90_000,
): Promise<Engines> {
  const started = await Promise.allSettled(
    Array.from({ length: count }, () => startSim({ args: [...simArgs], timeoutMs })),
  );
  const sims = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  if (sims.length < count) {
    await Promise.all(sims.map((s) => s.stop()));
    throw (started.find((s) => s.status === "rejected") as PromiseRejectedResult).reason;
  }
  return {
    mode: "processes",
    engines: sims.map((s) => ({ url: s.url, kvEndpoint: s.kvEndpoint, replayEndpoint: s.replayEndpoint })),
    pids: sims.map((s) => s.pid),
    alive: () => sims.every((s) => isRunning(s.child)),
    output: () => sims.map((s) => s.output()).join("\n"),
    close: async () => {
      await Promise.all(sims.map((s) => s.stop()));
    },
  };
}

/** `POST /reset_prefix_cache` on every engine (retried: vLLM refuses it while requests run). */
export async function resetCaches(engines: readonly Engine[]): Promise<void> {
  for (const e of engines) {
    for (let i = 0; ; i++) {
      const r = await fetch(`${e.url}/reset_prefix_cache`, { method: "POST" }).catch(() => null);
      if (r?.ok) break;
      if (i > 600) throw new Error(`reset_prefix_cache on ${e.url}: ${r?.status ?? "no answer"}`);
      await new Promise((res) => setTimeout(res, 100));
    }
  }
}

/** Sum of one Prometheus metric's samples (all label sets) in /metrics text. */
export function metricSum(text: string, name: string): number {
  let total = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== " " && rest[0] !== "{") continue;
    const v = Number(line.slice(line.lastIndexOf(" ") + 1));
    if (Number.isFinite(v)) total += v;
  }
  return total;
}

/** Per engine: requests finished, prompt and computed prompt tokens (the load served so far). */
export async function engineCounters(
  engines: readonly Engine[],
): Promise<Array<{ requests: number; promptTokens: number; prefillTokens: number; preemptions: number }>> {
  return Promise.all(
    engines.map(async (e) => {
      const text = await fetchText(`${e.url}/metrics`);
      const promptTokens = metricSum(text, "vllm:prompt_tokens_total");
      return {
        requests: metricSum(text, "vllm:request_success_total"),
        promptTokens,
        // What the engine computed: prompt tokens less its prefix-cache hits.
        prefillTokens: promptTokens - metricSum(text, "vllm:prefix_cache_hits_total"),
        preemptions: metricSum(text, "vllm:num_preemptions_total"),
      };
    }),
  );
}

/** GET with a few retries: an engine busy with a burst may reset a connection. */
export async function fetchText(url: string): Promise<string> {
  for (let i = 0; ; i++) {
    try {
      return await (await fetch(url)).text();
    } catch (err) {
      if (i >= 5) throw err;
      await new Promise((r) => setTimeout(r, 200 * (i + 1)));
    }
  }
}

/** CPU seconds (user + system) a process has used, from /proc/<pid>/stat; 0 once it is gone. */
export function cpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    return (Number(f[11]) + Number(f[12])) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** USER_HZ: 100 on every Linux architecture Node runs on. */
const CLK_TCK = 100;
