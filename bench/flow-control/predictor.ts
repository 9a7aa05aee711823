/**
 * Issue #29's predictor goal: |predicted − observed| TTFT of the `predicted-ttft` predictor,
 * median ≤ 25 %, p90 ≤ 60 %, measured while today's default (`kv-aware`) routes: the profile is
 * the kv-aware preset's mixed step plus `predicted-ttft` at weight 0 (it learns and predicts,
 * it does not move a decision), so the figure is the predictor's, on the default's traffic.
 *
 *   node bench/flow-control/predictor.ts [--workers 4] [--speed 0.25] [--rates 4,12]
 *     [--seconds 40] [--warm 8] [--slow-at 0] [--slow-speed 0.08] [--out FILE]
 *
 * Workers: `--workers` simulated Qwen3-32B/TP2 engines (bench/fleet-routing's profile) at
 * `--speed`. Traffic: multi-turn chat sessions (8 tenants' system prompts, each turn re-sends
 * the history; Poisson session starts), streamed, 32 output tokens, each `--rates` value
 * (requests/s, wall) for `--seconds`. Each rate is a phase of one run (the predictor keeps
 * learning across phases, as a server would). Samples before each worker's `--warm`-th are
 * left out (the cold start, reported apart). `--slow-at S`: S seconds into the last phase,
 * worker 0 is restarted at `--slow-speed` on the same port (the adaptation case); its errors
 * are then reported apart too. Output: a table per phase and a JSON line per phase (--out).
 */
import { writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { presets } from "../../src/router/pipeline/presets.ts";
import { startServer } from "../../src/server/app.ts";
import { createLogger } from "../../src/util/log.ts";
import { mixedRecord } from "../../test/helpers/records.ts";
import { type SimProcess, startSim } from "../../test/helpers/sim.ts";
import { exitWithUsageIfAsked } from "../usage.ts";

const args = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, args);
const str = (n: string, d: string) => {
  const i = args.indexOf(`--${n}`);
  return i >= 0 ? args[i + 1]! : d;
};
const HERE = fileURLToPath(new URL(".", import.meta.url));
const WORKERS = Number(str("workers", "4"));
const SPEED = str("speed", "0.25");
const RATES = str("rates", "4,12").split(",").map(Number);
const SECONDS = Number(str("seconds", "40"));
const WARM = Number(str("warm", "8"));
const SLOW_AT = Number(str("slow-at", "0"));
const SLOW_SPEED = str("slow-speed", "0.08");
const OUT = str("out", "");
const PROFILE = join(HERE, "../fleet-routing/qwen3-32b-tp2-h100.json");
const MODEL = "sim-model";

const simArgs = (speed: string) => [
  "--block-size",
  "16",
  "--speed",
  speed,
  "--profile",
  PROFILE,
  "--max-num-seqs",
  "64",
];

let seed = 29;
const rand = () => {
  seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
  return seed / 2 ** 32;
};
const exp = (mean: number) => -Math.log(1 - rand()) * mean;
const WORDS = "router engine cache block prefix token queue tenant model worker latency batch".split(" ");
const text = (n: number, tag: string) =>
  `${tag} ${Array.from({ length: n }, () => WORDS[Math.floor(rand() * WORDS.length)]).join(" ")}`;
const TENANTS = Array.from({ length: 8 }, (_, i) => text(250, `tenant-${i} rules:`));

interface Sample {
  worker: string;
  predicted: number;
  observed: number;
  phase: number;
  slowed: boolean;
}

async function main(): Promise<void> {
  const logger = createLogger("bench");
  logger.level = "warn";
  const sims: SimProcess[] = await Promise.all(
    Array.from({ length: WORKERS }, () => startSim({ args: simArgs(SPEED) })),
  );
  const records: WorkerRecord[] = sims.map((s, i) =>
    mixedRecord({
      id: `w${i}`,
      model: MODEL,
      url: s.url,
      maxModelLen: 131072,
      kvEvents: {
        endpoint: s.kvEndpoint,
        replayEndpoint: s.replayEndpoint,
        topic: "kv-events",
        framing: "seq",
      },
    }),
  );
  const kvAware = presets["kv-aware"]!({}).mixed;
  const server = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "kv-aware",
      scrapeIntervalMs: 250,
      profiles: {
        mixed: { ...kvAware, scorers: [...kvAware.scorers, { name: "predicted-ttft", weight: 0 }] },
      },
    },
    { discovery: new MemoryDiscovery(records), logger },
  );
  const samples: Sample[] = [];
  let phase = 0;
  let slowed = false;
  const report = server.ttftReport;
  const observed = report.observed.bind(report);
  const seen = new Map<string, number>();
  report.observed = (model, id, step, p, o) => {
    observed(model, id, step, p, o);
    const d = server.decisions.list({ limit: 256 }).find((x) => x.requestId === id);
    const w = d?.winner ?? "?";
    const n = (seen.get(w) ?? 0) + 1;
    seen.set(w, n);
    if (!Number.isNaN(p))
      samples.push({
        worker: w,
        predicted: p,
        observed: o,
        phase: n <= WARM ? -1 : phase,
        slowed: slowed && w === "w0",
      });
  };
  const client = async (messages: { role: string; content: string }[]): Promise<string> => {
    const r = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages, max_tokens: 32, stream: true }),
    });
    let out = "";
    for await (const c of r.body ?? []) out += Buffer.from(c).toString();
    return out.length > 0 ? text(40, "answer") : "";
  };
  const inFlight = new Set<Promise<void>>();
  const session = async (): Promise<void> => {
    const messages = [{ role: "system", content: TENANTS[Math.floor(rand() * TENANTS.length)]! }];
    const turns = 2 + Math.floor(rand() * 5);
    for (let t = 0; t < turns; t++) {
      messages.push({ role: "user", content: text(20 + Math.floor(rand() * 120), "q") });
      const a = await client(messages).catch(() => "");
      messages.push({ role: "assistant", content: a });
      await new Promise((r) => setTimeout(r, exp(1000)));
    }
  };
  const results: unknown[] = [];
  for (const rate of RATES) {
    const start = Date.now();
    // Sessions average 4 turns: session starts at rate/4 give about `rate` requests/s.
    const sessionRate = rate / 4;
    let slowTimer: NodeJS.Timeout | null = null;
    if (SLOW_AT > 0 && phase === RATES.length - 1)
      slowTimer = setTimeout(async () => {
        const port = sims[0]!.port;
        const kv = { endpoint: sims[0]!.kvEndpoint, replay_endpoint: sims[0]!.replayEndpoint };
        await sims[0]!.stop();
        sims[0] = await startSim({ port, args: simArgs(SLOW_SPEED), kvEvents: kv });
        slowed = true;
        console.log(`worker w0 restarted at --speed ${SLOW_SPEED}`);
      }, SLOW_AT * 1000);
    while (Date.now() - start < SECONDS * 1000) {
      const p = session().finally(() => inFlight.delete(p));
      inFlight.add(p);
      await new Promise((r) => setTimeout(r, exp(1000 / sessionRate)));
    }
    await Promise.all(inFlight);
    if (slowTimer) clearTimeout(slowTimer);
    const mine = samples.filter((s) => s.phase === phase);
    const row = summarize(`rate ${rate}/s`, mine);
    const slowRow = summarize(
      `rate ${rate}/s, slowed w0`,
      mine.filter((s) => s.slowed),
    );
    results.push({ rate, ...row, slowed: slowRow, load: loadavg()[0] });
    phase++;
  }
  results.push({
    cold: summarize(
      "cold start (first samples per worker)",
      samples.filter((s) => s.phase === -1),
    ),
  });
  if (OUT) writeFileSync(OUT, `${results.map((r) => JSON.stringify(r)).join("\n")}\n`);
  await server.close();
  await Promise.all(sims.map((s) => s.stop()));
}

function summarize(label: string, s: Sample[]) {
  const rel = s.map((x) => Math.abs(x.predicted - x.observed) / x.observed).sort((a, b) => a - b);
  const obs = s.map((x) => x.observed).sort((a, b) => a - b);
  const q = (v: number[], p: number) =>
    v.length ? v[Math.min(v.length - 1, Math.floor(p * v.length))]! : Number.NaN;
  const row = {
    label,
    samples: s.length,
    medianRelError: q(rel, 0.5),
    p90RelError: q(rel, 0.9),
    ttftP50ms: q(obs, 0.5),
    ttftP90ms: q(obs, 0.9),
  };
  console.log(
    `${label.padEnd(40)} n=${String(row.samples).padStart(5)}  median ${(row.medianRelError * 100).toFixed(1)} %  p90 ${(row.p90RelError * 100).toFixed(1)} %  TTFT p50 ${row.ttftP50ms.toFixed(0)} ms p90 ${row.ttftP90ms.toFixed(0)} ms  (load ${loadavg()[0]!.toFixed(1)})`,
  );
  return row;
}

await main();
