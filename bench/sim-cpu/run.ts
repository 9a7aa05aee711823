/**
 * CPU cost of one simulated engine under load: STREAMS concurrent streamed chat requests at
 * --speed 1 (real time), closed loop. Reads the child's utime+stime from /proc/<pid>/stat
 * over a steady-state window, and the generated tokens from its /metrics.
 *
 * Side by side in the same run, with the same load generator:
 *   floor   a minimal Node HTTP server writing one SSE event per stream per ITL tick
 *           (floor-server.mjs): what any Node implementation pays for these writes here;
 *   sim     `infera-sim` with defaults (one event per token, as vLLM's --stream-interval 1);
 *   sim/4   `infera-sim --stream-interval 4`.
 *
 *   node --import tsx bench/sim-cpu/run.ts [--streams 64] [--seconds 15] [--max-tokens 256]
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { freePort } from "../../test/helpers/ports.ts";
import { parseMetric, startSim } from "../../test/helpers/sim.ts";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}

const STREAMS = arg("streams", 64);
const SECONDS = arg("seconds", 15);
const WARMUP = arg("warmup", 3);
const MAX_TOKENS = arg("max-tokens", 256);
const CLK_TCK = 100;

function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / CLK_TCK; // utime + stime
}

const prompts = Array.from({ length: 16 }, (_, i) =>
  `Conversation ${i}: summarise the quarterly report on cache efficiency and latency. `.repeat(8),
);

interface Window {
  cpu: number;
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
  const c0 = cpuSeconds(pid);
  await new Promise((r) => setTimeout(r, SECONDS * 1000));
  const cpu = cpuSeconds(pid) - c0;
  const wall = (performance.now() - t0) / 1000;
  measuring = false;
  await hooks.end?.();
  stop = true;
  await Promise.allSettled(clients);
  return { cpu, wall, events, requests, errors };
}

async function runFloor(itlMs: number): Promise<Window> {
  const port = await freePort();
  const script = fileURLToPath(new URL("./floor-server.mjs", import.meta.url));
  const child: ChildProcess = spawn(process.execPath, [script, String(port), String(itlMs)], {
    stdio: "inherit",
  });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${url}/health`)).ok) break;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  try {
    return await load(url, child.pid!, "sim-model");
  } finally {
    child.kill("SIGKILL");
  }
}

async function runSim(extra: string[]): Promise<Window & { tokens: number; itlMs: number }> {
  const sim = await startSim({ args: ["--speed", "1", "--max-model-len", "8192", ...extra] });
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

const pct = (w: Window): string => `${((w.cpu / w.wall) * 100).toFixed(1)} %`;

const sim = await runSim([]);
const floor = await runFloor(sim.itlMs);
const sim4 = await runSim(["--stream-interval", "4"]);

console.log(
  `sim-cpu: ${STREAMS} concurrent streams, --speed 1, max_tokens ${MAX_TOKENS}, ${SECONDS} s windows`,
);
console.log(
  `  sim tokens/s          ${(sim.tokens / sim.wall).toFixed(0)} (mean ITL ${sim.itlMs.toFixed(2)} ms)`,
);
for (const [name, w, tokens] of [
  ["floor (plain Node SSE)", floor, floor.events],
  ["sim (per token)", sim, sim.tokens],
  ["sim --stream-interval 4", sim4, sim4.tokens],
] as const) {
  console.log(
    `  ${name.padEnd(24)} CPU ${pct(w).padStart(7)} of one core   ${((w.cpu / Math.max(1, tokens)) * 1e6).toFixed(1).padStart(6)} us/token   ${w.events} events, ${w.requests} requests, ${w.errors} errors`,
  );
}
console.log(`  ratio sim / floor        ${(sim.cpu / sim.wall / (floor.cpu / floor.wall)).toFixed(2)}x`);
console.log(
  `  goal: sim <= 10 % of one core; machine load average ${loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}`,
);
