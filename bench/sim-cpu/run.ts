/**
 * CPU cost of one simulated engine under load: STREAMS concurrent streamed chat requests at
 * --speed 1 (real time), closed loop. Reads the child's utime and stime from /proc/<pid>/stat
 * and its read/write syscalls from /proc/<pid>/io over a steady-state window, and the
 * generated tokens from its /metrics.
 *
 * Rows, side by side in the same run, with the same load generator (--rows picks some):
 *   floor     a minimal Node HTTP server writing one SSE event per stream per ITL tick
 *             (floor-server.mjs): what any Node implementation pays for these writes here;
 *   sim       `infera-sim` with defaults (one event per token, as vLLM's --stream-interval 1),
 *             compiled (dist/, built first when stale), publishing KV events over ZMQ as a
 *             worker behind kv-aware routing does (so do tsx and sim4);
 *             Its SSE events leave through the io_uring batch writer where available
 *             (--io-uring auto: one system call per tick for all streams);
 *   nodewrite the same with --io-uring off: one socket.write per event;
 *   nokv      the same as sim with KV events off, vLLM's default;
 *   tsx       the same sim run from the TypeScript sources through tsx: what the build buys;
 *   sim4      `infera-sim --stream-interval 4`.
 *
 *   node --import tsx bench/sim-cpu/run.ts [--streams 64] [--seconds 15] [--max-tokens 256]
 *     [--rows floor,sim,nodewrite,nokv,tsx,sim4]
 *
 * INFERA_SIM_CPU_PROF=FILE writes a V8 CPU profile of the (first) sim row (see main.ts).
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { chooseEntry } from "../../scripts/dist-stamp.mjs";
import { freePort } from "../../test/helpers/ports.ts";
import { parseMetric, startSim } from "../../test/helpers/sim.ts";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}
const rowsArg = process.argv.indexOf("--rows");
const ROWS = (rowsArg >= 0 ? process.argv[rowsArg + 1] : "floor,sim,nodewrite,nokv,tsx,sim4").split(",");

const STREAMS = arg("streams", 64);
const SECONDS = arg("seconds", 15);
const WARMUP = arg("warmup", 3);
const MAX_TOKENS = arg("max-tokens", 256);
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

/** Closed-loop load on `url`; measures `pid`'s CPU over the window. Events = SSE data lines received. */
async function load(
  url: string,
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
        const res = await fetch(`${url}/v1/chat/completions`, {
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

async function runFloor(itlMs: number): Promise<Window> {
  const port = await freePort();
  const script = fileURLToPath(new URL("./floor-server.mjs", import.meta.url));
  const child: ChildProcess = spawn(process.execPath, [script, String(port), String(itlMs)], {
    stdio: "inherit",
  });
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitHealthy(url);
    return await load(url, child.pid!, "sim-model");
  } finally {
    child.kill("SIGKILL");
  }
}

interface SimWindow extends Window {
  tokens: number;
  itlMs: number;
}

interface SimLike {
  url: string;
  pid: number;
  model: string;
  metrics(): Promise<string>;
  stop(): Promise<void>;
}

async function measureSim(sim: SimLike): Promise<SimWindow> {
  try {
    let m0 = "";
    let m1 = "";
    const w = await load(sim.url, sim.pid, sim.model, {
      start: async () => {
        m0 = await sim.metrics();
      },
      end: async () => {
        m1 = await sim.metrics();
      },
    });
    const d = (name: string): number => (parseMetric(m1, name) ?? 0) - (parseMetric(m0, name) ?? 0);
    const itl =
      d("vllm:inter_token_latency_seconds_sum") / Math.max(1, d("vllm:inter_token_latency_seconds_count"));
    return { ...w, tokens: d("vllm:generation_tokens_total"), itlMs: itl * 1000 };
  } finally {
    await sim.stop();
  }
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

async function runSim(
  extra: string[],
  env: Record<string, string>,
  kvEvents?: Record<string, unknown>,
): Promise<SimWindow> {
  return measureSim(
    await startSim({ args: [...SIM_ARGS, ...extra], env: { ...env, ...profEnv() }, kvEvents }),
  );
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

const entry = ROWS.some((r) => ["sim", "sim4", "nokv", "nodewrite"].includes(r)) ? ensureDist() : "src";
const results: [string, Window, number][] = [];
let itlMs = 5;
let simTokPerS = 0;
for (const row of ROWS) {
  if (row === "sim") {
    const w = await runSim([], { INFERA_DIST: "1" });
    itlMs = w.itlMs;
    simTokPerS = w.tokens / w.wall;
    results.push([`sim (per token, ${entry})`, w, w.tokens]);
  } else if (row === "tsx") {
    const w = await runSim([], { INFERA_DIST: "0" });
    results.push(["sim (per token, tsx)", w, w.tokens]);
  } else if (row === "nodewrite") {
    // Every event through Node's socket.write, as before the io_uring batch writer.
    const w = await runSim(["--io-uring", "off"], { INFERA_DIST: "1" });
    results.push(["sim, --io-uring off", w, w.tokens]);
  } else if (row === "nokv") {
    // The other rows publish KV events over ZMQ, as a worker behind kv-aware routing does;
    // this one runs as vLLM does by default (no KV events), showing what publishing costs.
    const w = await runSim([], { INFERA_DIST: "1" }, { enable_kv_cache_events: false });
    results.push(["sim, KV events off", w, w.tokens]);
  } else if (row === "sim4") {
    const w = await runSim(["--stream-interval", "4"], { INFERA_DIST: "1" });
    results.push([`sim --stream-interval 4`, w, w.tokens]);
  } else if (row === "floor") {
    // The floor ticks at the sim's measured ITL when the sim ran first, else at 4.8 ms.
    const w = await runFloor(results.length > 0 ? itlMs : 4.8);
    results.push(["floor (plain Node SSE)", w, w.events]);
  } else throw new Error(`unknown row ${row}`);
}

const pctOf = (sec: number, w: Window): string => `${((sec / w.wall) * 100).toFixed(1)} %`;
console.log(
  `sim-cpu: ${STREAMS} concurrent streams, --speed 1, max_tokens ${MAX_TOKENS}, ${SECONDS} s windows`,
);
if (simTokPerS > 0)
  console.log(`  sim tokens/s            ${simTokPerS.toFixed(0)} (mean ITL ${itlMs.toFixed(2)} ms)`);
console.log(
  `  ${"row".padEnd(24)} ${"CPU".padStart(7)} ${"user".padStart(7)} ${"sys".padStart(7)}  us/token (user+sys)   writes/token reads/token  events requests errors`,
);
for (const [name, w, tokens] of results) {
  const per = (x: number): string => ((x / Math.max(1, tokens)) * 1e6).toFixed(1);
  console.log(
    `  ${name.padEnd(24)} ${pctOf(w.utime + w.stime, w).padStart(7)} ${pctOf(w.utime, w).padStart(7)} ${pctOf(w.stime, w).padStart(7)}  ${per(w.utime + w.stime).padStart(6)} (${per(w.utime)}+${per(w.stime)})`.padEnd(
      74,
    ) +
      `${(w.syscw / Math.max(1, tokens)).toFixed(2).padStart(8)} ${(w.syscr / Math.max(1, tokens)).toFixed(2).padStart(10)}  ${w.events} ${w.requests} ${w.errors}`,
  );
}
const floorRow = results.find(([n]) => n.startsWith("floor"));
const simRow = results.find(([n]) => n === `sim (per token, ${entry})`);
if (floorRow && simRow) {
  const r = (w: Window): number => (w.utime + w.stime) / w.wall;
  console.log(`  ratio sim / floor        ${(r(simRow[1]) / r(floorRow[1])).toFixed(2)}x`);
}
console.log(
  `  goal: sim <= 10 % of one core; machine load average ${loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}`,
);
