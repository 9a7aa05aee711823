/**
 * CPU cost of one simulated engine under load: STREAMS concurrent streamed chat requests at
 * --speed 1 (real time), closed loop. Reads the child's utime and stime from /proc/<pid>/stat
 * and its read/write syscalls from /proc/<pid>/io over a steady-state window, and the
 * generated tokens from its /metrics. Every row's process is started first; the rows are then
 * measured in turn, --rounds times over, and each reports its median window (this VM's speed
 * drifts by ±30 % over minutes; interleaving spreads that over all rows alike).
 *
 * Rows, side by side in the same run, with the same load generator (--rows picks some):
 *   floor     a minimal Node HTTP server writing one SSE event per stream per ITL tick
 *             (floor-server.mjs): what any Node implementation pays for these writes here;
 *   sim       `infera-sim` with defaults (one event per token, as vLLM's --stream-interval 1),
 *             compiled (dist/, built first when stale), publishing KV events over ZMQ as a
 *             worker behind kv-aware routing does (so do tsx and sim4); one socket.write per
 *             stream per tick;
 *   nokv      the same as sim with KV events off, vLLM's default;
 *   tsx       the same sim run from the TypeScript sources through tsx: what the build buys;
 *   sim4      `infera-sim --stream-interval 4`;
 *   fleet     `infera-sim --fleet N` (--fleet-size, default 64): N engines in one process, the
 *             streams spread evenly over them (stream i → engine i mod N), KV events on as in
 *             sim; tokens summed over the engines' /metrics. Not in the default rows.
 *
 *   node bench/sim-cpu/run.ts [--streams 64] [--seconds 6] [--rounds 3] [--max-tokens 256]
 *     [--rows floor,sim,nokv,tsx,sim4,fleet] [--fleet-size 64]
 *
 * INFERA_SIM_CPU_PROF=FILE writes a V8 CPU profile of the (first) sim row (see main.ts).
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chooseEntry } from "../../scripts/dist-stamp.mjs";
import { freePort } from "../../test/helpers/ports.ts";
import { parseMetric, startSim } from "../../test/helpers/sim.ts";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}
const rowsArg = process.argv.indexOf("--rows");
const ROWS = (rowsArg >= 0 ? process.argv[rowsArg + 1] : "floor,sim,nokv,tsx,sim4").split(",");

const STREAMS = arg("streams", 64);
const SECONDS = arg("seconds", 6);
const ROUNDS = arg("rounds", 3);
const WARMUP = arg("warmup", 2);
const MAX_TOKENS = arg("max-tokens", 256);
const FLEET_SIZE = arg("fleet-size", 64);
const CLK_TCK = 100;
const ROOT = fileURLToPath(new URL("../../", import.meta.url));

interface ProcSample {
  utime: number;
  stime: number;
  syscr: number;
  syscw: number;
}

function sample(pid: number): ProcSample {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const io = readFileSync(`/proc/${pid}/io`, "utf8");
  const num = (key: string): number => Number(new RegExp(`^${key}: (\\d+)`, "m").exec(io)?.[1] ?? 0);
  return {
    utime: Number(fields[11]) / CLK_TCK,
    stime: Number(fields[12]) / CLK_TCK,
    syscr: num("syscr"),
    syscw: num("syscw"),
  };
}

const prompts = Array.from({ length: 16 }, (_, i) =>
  `Conversation ${i}: summarise the quarterly report on cache efficiency and latency. `.repeat(8),
);

interface Window {
  utime: number;
  stime: number;
  syscr: number;
  syscw: number;
  wall: number;
  events: number;
  requests: number;
  errors: number;
}

/**
 * Closed-loop load, stream i on `urls[i % urls.length]`; measures `pid`'s CPU over the window.
 * Events = SSE data lines received.
 */
async function load(
  urls: readonly string[],
  pid: number,
  model: string,
  hooks: { start?: () => Promise<void>; end?: () => Promise<void> } = {},
): Promise<Window> {
  let stop = false;
  let measuring = false;
  let events = 0;
  let requests = 0;
  let errors = 0;
  const decoder = new TextDecoder();
  const client = async (i: number): Promise<void> => {
    let k = 0;
    while (!stop) {
      try {
        const res = await fetch(`${urls[i % urls.length]}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            model,
            messages: [{ role: "user", content: `${prompts[(i + k++) % prompts.length]} (client ${i})` }],
            max_tokens: MAX_TOKENS,
            stream: true,
          }),
        });
        const reader = res.body!.getReader();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          if (measuring) events += decoder.decode(value).split("data: ").length - 1;
        }
        if (measuring) requests++;
      } catch {
        errors++;
      }
    }
  };
  const clients = Array.from({ length: STREAMS }, (_, i) => client(i));
  await new Promise((r) => setTimeout(r, WARMUP * 1000));
  await hooks.start?.();
  measuring = true;
  const t0 = performance.now();
  const s0 = sample(pid);
  await new Promise((r) => setTimeout(r, SECONDS * 1000));
  const s1 = sample(pid);
  const wall = (performance.now() - t0) / 1000;
  measuring = false;
  await hooks.end?.();
  stop = true;
  await Promise.allSettled(clients);
  return {
    utime: s1.utime - s0.utime,
    stime: s1.stime - s0.stime,
    syscr: s1.syscr - s0.syscr,
    syscw: s1.syscw - s0.syscw,
    wall,
    events,
    requests,
    errors,
  };
}

async function waitHealthy(url: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    try {
      if ((await fetch(`${url}/health`)).ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${url} did not become healthy`);
}

/** A row's process, started once and loaded in every round. */
interface Target {
  name: string;
  /** One URL, or a fleet's engines (the streams are spread over them). */
  urls: string[];
  pid: number;
  model: string;
  /** The sim's /metrics, one text per engine (tokens counted from them); null for the floor. */
  metrics: (() => Promise<string[]>) | null;
  stop(): Promise<void>;
}

async function startFloor(itlMs: number): Promise<Target> {
  const port = await freePort();
  const script = fileURLToPath(new URL("./floor-server.mjs", import.meta.url));
  const child: ChildProcess = spawn(process.execPath, [script, String(port), String(itlMs)], {
    stdio: "inherit",
  });
  const url = `http://127.0.0.1:${port}`;
  await waitHealthy(url);
  return {
    name: "floor (plain Node SSE)",
    urls: [url],
    pid: child.pid!,
    model: "sim-model",
    metrics: null,
    stop: async () => {
      child.kill("SIGKILL");
    },
  };
}

interface RowWindow extends Window {
  /** Tokens (sims, from vllm:generation_tokens_total) or SSE events (floor). */
  units: number;
  itlMs: number;
}

async function measure(t: Target): Promise<RowWindow> {
  let m0: string[] = [];
  let m1: string[] = [];
  const w = await load(t.urls, t.pid, t.model, {
    start: async () => {
      if (t.metrics) m0 = await t.metrics();
    },
    end: async () => {
      if (t.metrics) m1 = await t.metrics();
    },
  });
  if (!t.metrics) return { ...w, units: w.events, itlMs: 0 };
  const sum = (texts: string[], name: string): number =>
    texts.reduce((a, x) => a + (parseMetric(x, name) ?? 0), 0);
  const d = (name: string): number => sum(m1, name) - sum(m0, name);
  const itl =
    d("vllm:inter_token_latency_seconds_sum") / Math.max(1, d("vllm:inter_token_latency_seconds_count"));
  return { ...w, units: d("vllm:generation_tokens_total"), itlMs: itl * 1000 };
}

const SIM_ARGS = ["--speed", "1", "--max-model-len", "8192"];
let profiled = false;
/** The profile env var goes to the first sim row only (one profile per run). */
function profEnv(): Record<string, string> {
  const f = process.env.INFERA_SIM_CPU_PROF;
  if (!f || profiled) return { INFERA_SIM_CPU_PROF: "" };
  profiled = true;
  return { INFERA_SIM_CPU_PROF: f };
}

async function startSimRow(
  name: string,
  extra: string[],
  env: Record<string, string>,
  kvEvents?: Record<string, unknown>,
): Promise<Target> {
  const sim = await startSim({ args: [...SIM_ARGS, ...extra], env: { ...env, ...profEnv() }, kvEvents });
  return {
    name,
    urls: [sim.url],
    pid: sim.pid,
    model: sim.model,
    metrics: async () => [await sim.metrics()],
    stop: () => sim.stop(),
  };
}

/** `infera-sim --fleet FLEET_SIZE`: one process, its engines on free ports (from the manifest). */
async function startFleetRow(): Promise<Target> {
  const dir = mkdtempSync(join(tmpdir(), "sim-cpu-fleet-"));
  const file = join(dir, "manifest.json");
  const kv = JSON.stringify({
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: "tcp://127.0.0.1:*",
    replay_endpoint: "tcp://127.0.0.1:*",
    topic: "kv-events",
  });
  const child = spawn(
    process.execPath,
    [
      `${ROOT}bin/infera-sim.js`,
      "--fleet",
      String(FLEET_SIZE),
      "--fleet-manifest",
      file,
      "serve",
      "sim-model",
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--kv-events-config",
      kv,
      ...SIM_ARGS,
    ],
    { stdio: "inherit", env: { ...process.env, INFERA_DIST: "1", INFERA_LOG_LEVEL: "warn", ...profEnv() } },
  );
  for (let i = 0; !existsSync(file); i++) {
    if (child.exitCode !== null || i > 1200) throw new Error("the fleet did not start");
    await new Promise((r) => setTimeout(r, 50));
  }
  const m = JSON.parse(readFileSync(file, "utf8")) as { engines: { url: string }[] };
  const urls = m.engines.map((e) => e.url);
  return {
    name: `fleet of ${FLEET_SIZE} (${entry})`,
    urls,
    pid: child.pid!,
    model: "sim-model",
    metrics: () => Promise.all(urls.map(async (u) => (await fetch(`${u}/metrics`)).text())),
    stop: async () => {
      child.kill("SIGTERM");
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * The sim rows run `bin/infera-sim.js`, which runs the compiled dist/ when it matches the
 * sources (scripts/build.mjs). Built here first when stale, so "sim" always measures the current
 * source as shipped (npm ci builds it); the "tsx" row forces the TypeScript sources through tsx.
 */
function ensureDist(): "dist" | "src" {
  if (chooseEntry() === "dist") return "dist";
  const r = spawnSync(process.execPath, [`${ROOT}scripts/build.mjs`], { stdio: "inherit" });
  if (r.status !== 0) throw new Error("scripts/build.mjs failed");
  return chooseEntry();
}

const entry = ROWS.some((r) => ["sim", "sim4", "nokv", "fleet"].includes(r)) ? ensureDist() : "src";
const SIM_NAME = `sim (per token, ${entry})`;

async function startRow(row: string): Promise<Target> {
  switch (row) {
    case "sim":
      return startSimRow(SIM_NAME, [], { INFERA_DIST: "1" });
    case "tsx":
      return startSimRow("sim (per token, tsx)", [], { INFERA_DIST: "0" });
    case "nokv":
      // The other rows publish KV events over ZMQ, as a worker behind kv-aware routing does;
      // this one runs as vLLM does by default (no KV events), showing what publishing costs.
      return startSimRow("sim, KV events off", [], { INFERA_DIST: "1" }, { enable_kv_cache_events: false });
    case "sim4":
      return startSimRow("sim --stream-interval 4", ["--stream-interval", "4"], { INFERA_DIST: "1" });
    case "fleet":
      return startFleetRow();
    case "floor":
      // Ticks at 4.8 ms, the default profile's ITL at 64 streams (the sim rows print theirs).
      return startFloor(4.8);
    default:
      throw new Error(`unknown row ${row}`);
  }
}

// Every row's process runs for the whole bench (idle ones cost nothing) and the rows are
// measured in turn, ROUNDS times over: a slow minute on this shared VM then hits every row
// alike instead of whichever row happened to run in it. Each row reports its median window.
const targets: Target[] = [];
for (const row of ROWS) targets.push(await startRow(row));
const windows = new Map<string, RowWindow[]>(targets.map((t) => [t.name, []]));
try {
  for (let round = 1; round <= ROUNDS; round++) {
    for (const t of targets) {
      windows.get(t.name)!.push(await measure(t));
      process.stderr.write(`  round ${round}/${ROUNDS}: ${t.name} done\n`);
    }
  }
} finally {
  for (const t of targets) await t.stop();
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const cpuPct = (w: Window): number => ((w.utime + w.stime) / w.wall) * 100;
const usPer = (w: RowWindow): number => ((w.utime + w.stime) / Math.max(1, w.units)) * 1e6;

console.log(
  `sim-cpu: ${STREAMS} concurrent streams, --speed 1, max_tokens ${MAX_TOKENS}, ${ROUNDS} interleaved rounds of ${SECONDS} s windows per row`,
);
const simWs = windows.get(SIM_NAME);
if (simWs && simWs.length > 0) {
  const tokPerS = median(simWs.map((w) => w.units / w.wall));
  console.log(
    `  sim tokens/s            ${tokPerS.toFixed(0)} (mean ITL ${median(simWs.map((w) => w.itlMs)).toFixed(2)} ms)`,
  );
}
console.log(
  `  ${"row".padEnd(26)} ${"CPU median".padStart(10)} ${"(min–max)".padEnd(14)} us/unit median (user+sys)  writes/unit  units errors`,
);
for (const t of targets) {
  const ws = windows.get(t.name)!;
  const cpu = ws.map(cpuPct);
  const tot = ws.reduce(
    (a, w) => ({
      u: a.u + w.utime,
      s: a.s + w.stime,
      n: a.n + w.units,
      wr: a.wr + w.syscw,
      e: a.e + w.errors,
    }),
    { u: 0, s: 0, n: 0, wr: 0, e: 0 },
  );
  const per = (x: number): string => ((x / Math.max(1, tot.n)) * 1e6).toFixed(1);
  console.log(
    `  ${t.name.padEnd(26)} ${`${median(cpu).toFixed(1)} %`.padStart(10)} ${`(${Math.min(...cpu).toFixed(1)}–${Math.max(...cpu).toFixed(1)})`.padEnd(14)} ${median(ws.map(usPer)).toFixed(1).padStart(6)} (${per(tot.u)}+${per(tot.s)})`.padEnd(
      84,
    ) + `${(tot.wr / Math.max(1, tot.n)).toFixed(2).padStart(6)}  ${tot.n} ${tot.e}`,
  );
}
if (simWs && simWs.length > 0) {
  const m = median(simWs.map(cpuPct));
  console.log(
    `  goal (sim <= 10 % of one core per token): ${m <= 10 ? "met" : "not met"} (median ${m.toFixed(1)} %)`,
  );
}
const floorWs = [...windows.entries()].find(([n]) => n.startsWith("floor"))?.[1];
if (floorWs && simWs) {
  console.log(
    `  ratio sim / floor (medians)  ${(median(simWs.map(cpuPct)) / median(floorWs.map(cpuPct))).toFixed(2)}x`,
  );
}
const fleetWs = [...windows.entries()].find(([n]) => n.startsWith("fleet"))?.[1];
if (fleetWs && fleetWs.length > 0) {
  console.log(
    `  fleet tokens/s          ${median(fleetWs.map((w) => w.units / w.wall)).toFixed(0)} (mean ITL ${median(fleetWs.map((w) => w.itlMs)).toFixed(2)} ms; ${FLEET_SIZE} engines, ${STREAMS} streams)`,
  );
  if (simWs && simWs.length > 0)
    console.log(
      `  ratio fleet / sim, CPU per token (medians)  ${(median(fleetWs.map(usPer)) / median(simWs.map(usPer))).toFixed(2)}x`,
    );
}
console.log(
  `  units: tokens for the sims, SSE events for the floor; machine load average ${loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}`,
);
