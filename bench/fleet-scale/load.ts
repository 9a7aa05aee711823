/**
 * Open-loop load for the fleet-scale bench, as its own process (so its CPU share shows apart
 * from the server's): short non-streamed completions sent at a fixed rate whatever the answers
 * do, through undici pools (the openai client costs too much CPU for 2,000 req/s on 2 cores).
 *
 *   node bench/fleet-scale/load.ts --urls http://a,http://b --rate 2000 --seconds 20
 *     [--model sim-model] [--prefixes 64] [--max-in-flight 2000] [--connections 128] [--seed 1]
 *
 * Requests round-robin over `--urls`. Prompts: one of `--prefixes` shared ~32-token prefixes
 * (a system prompt) then a distinct ~16-token tail, so every request stores at least one new
 * block and the shared prefixes give kv-aware routing something to find. max_tokens 1–4.
 * A send that would pass `--max-in-flight` is counted as not sent (the server has fallen
 * behind; an open loop must not turn into a closed one). Prints one JSON line on stdout.
 */
import { Pool } from "undici";

const argv = process.argv.slice(2);
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : def;
};
const URLS = opt("urls", "").split(",").filter(Boolean);
const RATE = Number(opt("rate", "2000"));
const SECONDS = Number(opt("seconds", "20"));
const MODEL = opt("model", "sim-model");
const PREFIXES = Number(opt("prefixes", "64"));
const MAX_IN_FLIGHT = Number(opt("max-in-flight", "2000"));
const CONNECTIONS = Number(opt("connections", "128"));
let seed = Number(opt("seed", "1")) >>> 0;
/** Prefix index offset: a later phase can use other prefixes than an earlier one. */
const PREFIX_BASE = Number(opt("prefix-base", "0"));
if (URLS.length === 0) throw new Error("--urls is required");

function rand(): number {
  // mulberry32
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

const WORDS = (
  "time year people way day man thing woman life child world school state family student group " +
  "country problem hand part place case week company system program question work government " +
  "number night point home water room mother area money story fact month lot right study book " +
  "eye job word business issue side kind head house service friend father power hour game line " +
  "end member law car city community name president team minute idea kid body information back " +
  "parent face others level office door health person art war history party result change morning"
).split(" ");
const word = () => WORDS[Math.floor(rand() * WORDS.length)];
const prefixes = Array.from({ length: PREFIXES }, (_, i) => {
  const w = Array.from({ length: 30 }, word).join(" ");
  return `System ${PREFIX_BASE + i}: ${w}.`;
});

/** An answer not begun or not finished this long after sending counts as an error (UND_ERR_*_TIMEOUT). */
const TIMEOUT_MS = Number(opt("timeout-ms", "60000"));
const pools = URLS.map(
  (u) =>
    new Pool(u, {
      connections: CONNECTIONS,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      headersTimeout: TIMEOUT_MS,
      bodyTimeout: TIMEOUT_MS,
    }),
);
const total = Math.round(RATE * SECONDS);
const latencies = new Float64Array(total);
let ok = 0;
let sent = 0;
let notSent = 0;
let inFlight = 0;
let promptTokens = 0;
let cachedTokens = 0;
const errors = new Map<string, number>();
/** How late sends went out against their schedule (ms), sampled per tick. */
let maxLagMs = 0;
let lagSum = 0;
let lagTicks = 0;

function fail(key: string): void {
  errors.set(key, (errors.get(key) ?? 0) + 1);
}

async function one(n: number): Promise<void> {
  const body = JSON.stringify({
    model: MODEL,
    prompt: `${prefixes[Math.floor(rand() * PREFIXES)]} Request ${n} ${seed % 100000}: ${Array.from({ length: 12 }, word).join(" ")}?`,
    max_tokens: 1 + (n % 4),
    stream: false,
  });
  const t0 = performance.now();
  inFlight++;
  try {
    const r = await pools[n % pools.length].request({
      path: "/v1/completions",
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    const text = await r.body.text();
    if (r.statusCode !== 200) {
      fail(`HTTP ${r.statusCode}`);
      return;
    }
    latencies[ok++] = performance.now() - t0;
    const u = (
      JSON.parse(text) as {
        usage?: { prompt_tokens?: number; prompt_tokens_details?: { cached_tokens?: number } | null };
      }
    ).usage;
    promptTokens += u?.prompt_tokens ?? 0;
    cachedTokens += u?.prompt_tokens_details?.cached_tokens ?? 0;
  } catch (err) {
    fail((err as { code?: string }).code ?? (err as Error).message.slice(0, 60));
  } finally {
    inFlight--;
  }
}

const pending: Promise<void>[] = [];
const t0 = performance.now();
const cpu0 = process.cpuUsage();
await new Promise<void>((done) => {
  const tick = () => {
    const now = performance.now();
    const due = Math.min(total, Math.floor(((now - t0) / 1000) * RATE));
    if (due > sent) {
      const lag = now - t0 - (sent / RATE) * 1000;
      maxLagMs = Math.max(maxLagMs, lag);
      lagSum += lag;
      lagTicks++;
    }
    while (sent < due) {
      const n = sent++;
      if (inFlight >= MAX_IN_FLIGHT) {
        notSent++;
        continue;
      }
      pending.push(one(n));
    }
    if (sent >= total) done();
    else setTimeout(tick, 1);
  };
  tick();
});
const sendSeconds = (performance.now() - t0) / 1000;
await Promise.all(pending);
const wallSeconds = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
await Promise.all(pools.map((p) => p.close()));

const lat = latencies.subarray(0, ok).sort();
const q = (p: number) =>
  lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : Number.NaN;
const r2 = (x: number) => Math.round(x * 100) / 100;
process.stdout.write(
  `${JSON.stringify({
    targetRate: RATE,
    scheduled: total,
    sent: total - notSent,
    notSent,
    ok,
    errors: Object.fromEntries(errors),
    sendSeconds: r2(sendSeconds),
    wallSeconds: r2(wallSeconds),
    sentPerS: r2((total - notSent) / sendSeconds),
    okPerS: r2(ok / wallSeconds),
    latencyMs: {
      p50: r2(q(0.5)),
      p90: r2(q(0.9)),
      p99: r2(q(0.99)),
      max: r2(lat[lat.length - 1] ?? Number.NaN),
    },
    sendLagMs: { mean: r2(lagTicks ? lagSum / lagTicks : 0), max: r2(maxLagMs) },
    /** This process's CPU over the run, in % of one core (it has exited when the bench reads /proc). */
    cpuPct: r2((cpu.user + cpu.system) / 1e4 / wallSeconds),
    promptTokens,
    cachedTokens,
    hitRate: promptTokens ? r2((100 * cachedTokens) / promptTokens) / 100 : 0,
  })}\n`,
);
