/**
 * The fleet-scale bench's child processes: one `infera-sim --fleet N`, `infera server`
 * replicas, the round-robin balancer and the load generator. Each is its own process so its
 * CPU share and RSS can be read apart from the others'.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { killOnExit, stopChild } from "../../src/util/child-process.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { rssOf, scrape, sumOf } from "./measure.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const HERE = fileURLToPath(new URL(".", import.meta.url));

/** What every child here gets: its output kept (the tail) for error messages. */
export interface Child {
  proc: ChildProcess;
  pid: number;
  output(): string;
  /** The first output line matching `re` from now on. */
  firstLine(re: RegExp): Promise<string>;
  stop(): Promise<void>;
}

export function child(cmd: string, argv: string[], env: Record<string, string> = {}): Child {
  // Lines split across chunks are missed by firstLine; pino writes a line per write.
  const proc = spawn(cmd, argv, {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, INFERA_LOG_LEVEL: "warn", ...env },
  });
  // Killed if the runner dies first (its main calls handleFatalSignals).
  killOnExit(proc);
  let out = "";
  const watchers: { re: RegExp; resolve(line: string): void }[] = [];
  const keep = (d: Buffer) => {
    const text = d.toString();
    out = (out + text).slice(-8000);
    if (watchers.length === 0) return;
    for (const line of text.split("\n"))
      for (let k = watchers.length - 1; k >= 0; k--)
        if (watchers[k].re.test(line)) {
          watchers[k].resolve(line);
          watchers.splice(k, 1);
        }
  };
  proc.stdout?.on("data", keep);
  proc.stderr?.on("data", keep);
  return {
    proc,
    pid: proc.pid ?? -1,
    output: () => out,
    firstLine: (re) => new Promise((resolve) => watchers.push({ re, resolve })),
    async stop() {
      await stopChild(proc, 10_000);
    },
  };
}

const gone = (c: Child) => c.proc.exitCode !== null || c.proc.signalCode !== null;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface FleetManifest {
  pid: number;
  engines: {
    index: number;
    url: string;
    port: number;
    kvRanks: { rank: number; endpoint: string; replayEndpoint: string | null }[];
  }[];
}

export interface FleetOptions {
  count: number;
  blockSize: number;
  blocks: number;
  manifest: string;
  /** Where bin/infera-sim.js is taken from (default: this checkout). */
  simRoot?: string;
  timeoutMs: number;
  /** Give up when the fleet's RSS passes this (MiB) while it starts. */
  maxRssMiB: number;
  model: string;
}

/**
 * `infera-sim --fleet N` with KV events on every engine, each on any free port (the manifest
 * names them), block size and pool as the router's kv-aware index expects them.
 */
export async function startFleet(o: FleetOptions): Promise<{ child: Child; manifest: FleetManifest }> {
  const kvCfg = {
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: "tcp://127.0.0.1:*",
    replay_endpoint: "tcp://127.0.0.1:*",
    topic: "kv-events",
  };
  // A manifest left from an earlier run would read as this fleet's.
  rmSync(o.manifest, { force: true });
  const c = child(process.execPath, [
    join(o.simRoot ?? ROOT, "bin/infera-sim.js"),
    "serve",
    o.model,
    "--fleet",
    String(o.count),
    "--fleet-manifest",
    o.manifest,
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--block-size",
    String(o.blockSize),
    "--num-gpu-blocks",
    String(o.blocks),
    "--kv-events-config",
    JSON.stringify(kvCfg),
  ]);
  const deadline = Date.now() + o.timeoutMs;
  for (;;) {
    if (gone(c)) throw new Error(`fleet exited (${c.proc.exitCode ?? c.proc.signalCode}): ${c.output()}`);
    if (existsSync(o.manifest)) {
      const manifest = JSON.parse(readFileSync(o.manifest, "utf8")) as FleetManifest;
      if (manifest.engines.length !== o.count)
        throw new Error(`manifest lists ${manifest.engines.length} engines, not ${o.count}`);
      return { child: c, manifest };
    }
    const rss = rssOf(c.pid).rssMiB;
    if (rss > o.maxRssMiB) {
      await c.stop();
      throw new Error(`fleet RSS ${rss.toFixed(0)} MiB passed the cap of ${o.maxRssMiB} MiB while starting`);
    }
    if (Date.now() > deadline) {
      await c.stop();
      throw new Error(`fleet not up within ${o.timeoutMs / 1000} s: ${c.output()}`);
    }
    await sleep(250);
  }
}

/** The static-discovery records of a fleet's engines (vLLM-framed KV events, rank 0). */
export function workerRecords(m: FleetManifest, model: string, blockSize: number, blocks: number) {
  return m.engines.map((e) => ({
    id: `fleet-${e.index}`,
    url: e.url,
    model,
    servedModelNames: [model],
    engine: "vllm",
    blockSize,
    kvBlocks: blocks,
    kvEvents: {
      endpoint: e.kvRanks[0].endpoint,
      ...(e.kvRanks[0].replayEndpoint ? { replayEndpoint: e.kvRanks[0].replayEndpoint } : {}),
      topic: "kv-events",
      framing: "seq",
    },
  }));
}

export interface Server extends Child {
  url: string;
}

/** `infera server --policy kv-aware` over the static workers file. */
export async function startServer(
  workersFile: string,
  logLevel = "warn",
  scrapeIntervalMs?: number,
  /**
   * Another checkout's server (a baseline), node flags (e.g. --cpu-prof), another policy than
   * kv-aware, more server flags and environment.
   */
  o: {
    root?: string;
    nodeArgs?: string[];
    policy?: string;
    args?: string[];
    env?: Record<string, string>;
  } = {},
): Promise<Server> {
  const port = await freePort();
  const c = child(
    process.execPath,
    [
      ...(o.nodeArgs ?? []),
      join(o.root ?? ROOT, "bin/infera.js"),
      ...serverArgs(port),
      "--discovery",
      "static",
      "--workers-file",
      workersFile,
      "--policy",
      o.policy ?? "kv-aware",
      ...(scrapeIntervalMs === undefined ? [] : ["--scrape-interval", String(scrapeIntervalMs)]),
      ...(o.args ?? []),
    ],
    { INFERA_LOG_LEVEL: logLevel, ...o.env },
  );
  return { ...c, url: `http://127.0.0.1:${port}` };
}

/**
 * Waits until the server routes to all `count` workers and follows every one's KV events
 * (subscribed, start-up replay asked of each: `infera_kv_replays_total` ≥ count).
 */
export async function waitServerReady(s: Server, count: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  for (;;) {
    if (gone(s)) throw new Error(`infera server exited: ${s.output()}`);
    try {
      const r = await fetch(`${s.url}/ready`);
      const j = (await r.json()) as { workers?: number };
      if (j.workers === count) {
        const text = await scrape(s.url);
        const subscribed = sumOf(text, "infera_kv_subscribed_workers");
        const replays = sumOf(text, "infera_kv_replays_total");
        last = `workers ${j.workers}, subscribed ${subscribed}, replays ${replays}`;
        if (subscribed === count && replays >= count) return;
      } else last = `workers ${j.workers}`;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline)
      throw new Error(`server not ready in ${timeoutMs / 1000} s (${last}): ${s.output()}`);
    await sleep(200);
  }
}

/** bench/kv-routing's round-robin balancer, in its own process. */
export async function startBalancer(targets: readonly string[]): Promise<Server> {
  const c = child(process.execPath, [join(HERE, "balance.ts"), ...targets]);
  const url = await new Promise<string>((resolve, reject) => {
    let buf = "";
    c.proc.stdout?.on("data", (d: Buffer) => {
      buf += d.toString();
      const m = /^(http:\/\/\S+)$/m.exec(buf);
      if (m) resolve(m[1]);
    });
    c.proc.once("exit", () => reject(new Error(`balancer exited: ${c.output()}`)));
  });
  return { ...c, url };
}

export interface LoadOptions {
  urls: readonly string[];
  rate: number;
  seconds: number;
  seed: number;
  prefixBase: number;
  model: string;
}

/** Runs the load generator to its end; `onStart` gets its pid (for its CPU share). */
export async function runLoad(
  o: LoadOptions,
  onStart: (pid: number) => void = () => {},
): Promise<Record<string, unknown>> {
  const c = child(process.execPath, [
    join(HERE, "load.ts"),
    "--urls",
    o.urls.join(","),
    "--rate",
    String(o.rate),
    "--seconds",
    String(o.seconds),
    "--seed",
    String(o.seed),
    "--prefix-base",
    String(o.prefixBase),
    "--model",
    o.model,
  ]);
  onStart(c.pid);
  let stdout = "";
  c.proc.stdout?.on("data", (d: Buffer) => {
    stdout += d.toString();
  });
  const code = await new Promise<number | null>((r) => c.proc.once("exit", (code) => r(code)));
  await c.stop();
  const line = stdout.trim().split("\n").pop() ?? "";
  if (code !== 0 || !line.startsWith("{")) throw new Error(`load generator failed (${code}): ${c.output()}`);
  return JSON.parse(line) as Record<string, unknown>;
}
