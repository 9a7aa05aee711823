/**
 * CPU cost of one simulated engine under load: 64 concurrent streamed chat requests at
 * --speed 1 (real time), closed loop. Reads the child's utime+stime from /proc/<pid>/stat
 * over a steady-state window and the generated tokens from its /metrics.
 *
 *   node --import tsx bench/sim-cpu/run.ts [--streams 64] [--seconds 20] [--max-tokens 256]
 */
import { readFileSync } from "node:fs";
import { parseMetric, startSim } from "../../test/helpers/sim.ts";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}

const STREAMS = arg("streams", 64);
const SECONDS = arg("seconds", 20);
const WARMUP = arg("warmup", 3);
const MAX_TOKENS = arg("max-tokens", 256);
const CLK_TCK = 100;

function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return Number(fields[11]) + Number(fields[12]); // utime + stime
}

const sim = await startSim({
  args: ["--speed", "1", "--max-model-len", "8192"],
  env: { INFERA_LOG_LEVEL: "warn" },
});
let stop = false;
let requests = 0;
let streamErrors = 0;
const prompts = Array.from({ length: 16 }, (_, i) =>
  `Conversation ${i}: summarise the quarterly report on cache efficiency and latency. `.repeat(8),
);

async function client(i: number): Promise<void> {
  let k = 0;
  while (!stop) {
    try {
      const res = await fetch(`${sim.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: sim.model,
          messages: [{ role: "user", content: `${prompts[(i + k++) % prompts.length]} (client ${i})` }],
          max_tokens: MAX_TOKENS,
          stream: true,
        }),
      });
      const reader = res.body!.getReader();
      for (;;) {
        const { done } = await reader.read();
        if (done) break;
      }
      requests++;
    } catch {
      streamErrors++;
    }
  }
}

const clients = Array.from({ length: STREAMS }, (_, i) => client(i));
await new Promise((r) => setTimeout(r, WARMUP * 1000));
const m0 = await sim.metrics();
const t0 = performance.now();
const c0 = cpuTicks(sim.pid);
await new Promise((r) => setTimeout(r, SECONDS * 1000));
const c1 = cpuTicks(sim.pid);
const t1 = performance.now();
const m1 = await sim.metrics();
stop = true;
await Promise.allSettled(clients);
await sim.stop();

const gen =
  (parseMetric(m1, "vllm:generation_tokens_total") ?? 0) -
  (parseMetric(m0, "vllm:generation_tokens_total") ?? 0);
const wall = (t1 - t0) / 1000;
const cpu = (c1 - c0) / CLK_TCK;
const running = parseMetric(m1, "vllm:num_requests_running") ?? 0;
const itlSum =
  (parseMetric(m1, "vllm:inter_token_latency_seconds_sum") ?? 0) -
  (parseMetric(m0, "vllm:inter_token_latency_seconds_sum") ?? 0);
const itlCount =
  (parseMetric(m1, "vllm:inter_token_latency_seconds_count") ?? 0) -
  (parseMetric(m0, "vllm:inter_token_latency_seconds_count") ?? 0);

console.log(
  `sim-cpu: ${STREAMS} concurrent streams, --speed 1, ${MAX_TOKENS} max tokens, ${wall.toFixed(1)} s window`,
);
console.log(`  running at end        ${running}`);
console.log(`  requests completed    ${requests} (errors ${streamErrors})`);
console.log(`  tokens generated      ${gen} (${(gen / wall).toFixed(0)} tok/s simulated = real)`);
console.log(`  mean inter-token      ${((itlSum / Math.max(1, itlCount)) * 1000).toFixed(2)} ms`);
console.log(
  `  sim CPU               ${cpu.toFixed(2)} s = ${((cpu / wall) * 100).toFixed(1)} % of one core (goal <= 10 %)`,
);
console.log(`  CPU per token         ${((cpu / Math.max(1, gen)) * 1e6).toFixed(1)} us`);
