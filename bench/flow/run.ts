/**
 * Flow control (issue #29 goals: two priority bands, a heavy tenant): one `infera-sim --fleet N`
 * and two `infera server`s on it, side by side in one run — today's default (kv-aware, no
 * queue) and the same with `flow` on (the `load` signal at GIE's defaults, 200 ms scrapes), or
 * one flow server per `--variants` entry.
 *
 *   node bench/flow/run.ts [--workers 2] [--speed 0.25] [--duration-s 20] [--prompt 512]
 *     [--output 64] [--cal-clients 32] [--phases bands,tenants]
 *     [--max-waiting N] [--max-in-flight N] [--load-params JSON] [--variants JSON] [--engine-priority]
 *     [--repeat 1] [--reuse-prompts] [--out bench/flow/results.json]
 *
 * 1. Capacity: closed loop, `--cal-clients` (32) clients per worker, `--duration-s`: completed
 *    requests per second (a floor of the fleet's capacity: more clients may get more through).
 * 2. Bands, on each server: high band at 0.4 × capacity alone (unloaded), then high 0.4 + low
 *    1.6 (2× capacity), then the high band alone again, Poisson arrivals: high TTFT p90 loaded
 *    against the same server's unloaded p90 (the two unloaded runs bracket the loaded one, so a
 *    box whose load drifts shows up as their spread), low band completed / offered, preemptions.
 *    `--repeat N` runs this phase N rounds, the servers taking turns, and prints the medians
 *    and the figures of all rounds' requests pooled.
 * 3. Tenants: three light tenants at 0.2 × capacity each, alone, then with a heavy one at 1.0
 *    (4× a fair share of 0.25): the light ones' TTFT p90; then all four at 1.0 (backlogged):
 *    Jain's index of served output tokens.
 * Latencies are wall time on this box (model time = wall × --speed); print `uptime` beside them.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { handleFatalSignals, killOnExit } from "../../src/util/child-process.ts";
import { serverArgs, spawnInfera } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { waitFor200 } from "../../test/helpers/wait.ts";
import { type Engine, engineCounters, startEngines } from "../fleet-routing/engines.ts";
import { MODEL, writeWorkersFile } from "../fleet-routing/servers.ts";
import { exitWithUsageIfAsked } from "../usage.ts";

const args = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, args);
const opt = (name: string, def: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : def;
};
const WORKERS = Number(opt("workers", "2"));
const SPEED = Number(opt("speed", "0.25"));
const DURATION_S = Number(opt("duration-s", "20"));
const PROMPT = Number(opt("prompt", "512"));
const OUTPUT = Number(opt("output", "64"));
const OUT = opt("out", join(import.meta.dirname, "results.json"));
const CAL_CLIENTS = Number(opt("cal-clients", "32"));
const PHASES = new Set(opt("phases", "bands,tenants").split(","));
/** The `load` signal's engine-queue bound (GIE's default 5 when not given): lower keeps less in front of a high-band request. */
const MAX_WAITING = opt("max-waiting", "");
/** The `load` signal's bound on this server's in-flight requests per worker (none when not given): a smaller running batch steps faster. */
const MAX_IN_FLIGHT = opt("max-in-flight", "");
/**
 * More `load` params as JSON, e.g. per-band thresholds:
 * '{"bands":{"low":{"maxInFlight":8,"maxWaiting":0}},"higherActiveMs":2000}'.
 */
const LOAD_PARAMS = JSON.parse(opt("load-params", "{}")) as Record<string, unknown>;
const loadParams = {
  ...(MAX_WAITING ? { maxWaiting: Number(MAX_WAITING) } : {}),
  ...(MAX_IN_FLIGHT ? { maxInFlight: Number(MAX_IN_FLIGHT) } : {}),
  ...LOAD_PARAMS,
};
/**
 * Engines under vLLM's `--scheduling-policy priority`, each request carrying vLLM's `priority`
 * body field by band (lower is scheduled first: vllm-project/vllm vllm/v1/core/sched/request_queue.py
 * @ 9feb38c, PriorityRequestQueue orders by (priority, arrival_time)): the engine then orders its own queue by
 * band too, which the router's queue cannot do for what it has already admitted.
 */
const ENGINE_PRIORITY = args.includes("--engine-priority");
/**
 * Several flow servers side by side instead of one: name → `load` params, e.g.
 * '{"flat8":{"maxWaiting":0,"maxInFlight":8},"low8":{"bands":{"low":{"maxInFlight":8,"maxWaiting":0}}}}'
 * (servers `kv-aware+flat8`, `kv-aware+low8`; --max-waiting etc. are then ignored).
 */
const VARIANTS = opt("variants", "")
  ? (JSON.parse(opt("variants", "")) as Record<string, Record<string, unknown>>)
  : null;
/** Rounds of the bands phase per server, the servers taking turns. */
const REPEAT = Number(opt("repeat", "1"));
const BODY_PRIORITY: Readonly<Record<string, number>> = { high: 0, normal: 1, low: 2 };

interface Shot {
  band: string;
  tenant: string;
  status: number;
  ttftMs: number | null;
  outputTokens: number;
}

/**
 * `words(n, seed)` has only 997 distinct values (seed mod 997): Runs 1–12 drew seeds at random,
 * so as a run went on more and more prompts were already in the engines' prefix caches and the
 * "2×" load shrank (later rounds' kv-aware was not overloaded at all). Each prompt now starts
 * with a word of its own, so no request hits another's cache; `--reuse-prompts` restores the old
 * prompts for a comparison with those runs.
 */
const REUSE_PROMPTS = args.includes("--reuse-prompts");
const RUN_ID = `u${Math.random().toString(36).slice(2, 8)}`;
let nth = 0;
const words = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => `w${(i * 7 + seed) % 997}`).join(" ");

async function shot(url: string, band: string, tenant: string, seed: number): Promise<Shot> {
  const t0 = performance.now();
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-infera-priority": band, "x-infera-tenant": tenant },
      body: JSON.stringify({
        model: MODEL,
        prompt: REUSE_PROMPTS ? words(PROMPT, seed) : `${RUN_ID}-${nth++} ${words(PROMPT - 1, seed)}`,
        max_tokens: OUTPUT,
        ignore_eos: true,
        stream: true,
        ...(ENGINE_PRIORITY ? { priority: BODY_PRIORITY[band] ?? 1 } : {}),
      }),
      signal: AbortSignal.timeout(120_000),
    });
    if (r.status !== 200 || !r.body) {
      await r.text();
      return { band, tenant, status: r.status, ttftMs: null, outputTokens: 0 };
    }
    let ttft: number | null = null;
    let chunks = 0;
    for await (const c of r.body) {
      if (ttft === null) ttft = performance.now() - t0;
      chunks += (
        Buffer.from(c)
          .toString()
          .match(/"text"/g) ?? []
      ).length;
    }
    return { band, tenant, status: 200, ttftMs: ttft, outputTokens: chunks };
  } catch {
    return { band, tenant, status: 0, ttftMs: null, outputTokens: 0 };
  }
}

/** Poisson arrivals of each stream for `DURATION_S`; resolves when every request ended. */
async function openLoop(
  url: string,
  streams: Array<{ band: string; tenant: string; rps: number }>,
): Promise<Shot[]> {
  const all: Promise<Shot>[] = [];
  let seed = Math.floor(Math.random() * 1e6);
  await Promise.all(
    streams.map(async (s) => {
      const end = performance.now() + DURATION_S * 1000;
      while (performance.now() < end) {
        all.push(shot(url, s.band, s.tenant, seed++));
        await new Promise((r) => setTimeout(r, (-Math.log(1 - Math.random()) / s.rps) * 1000));
      }
    }),
  );
  return Promise.all(all);
}

async function capacity(url: string): Promise<number> {
  const end = performance.now() + DURATION_S * 1000;
  let done = 0;
  let seed = 0;
  await Promise.all(
    Array.from({ length: CAL_CLIENTS * WORKERS }, async () => {
      while (performance.now() < end) if ((await shot(url, "normal", "cal", seed++)).status === 200) done++;
    }),
  );
  return done / DURATION_S;
}

const p90 = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? Math.round(s[Math.min(s.length - 1, Math.floor(0.9 * s.length))]) : null;
};
const ttfts = (shots: Shot[], f: (s: Shot) => boolean) =>
  shots.filter((s) => f(s) && s.ttftMs !== null).map((s) => s.ttftMs as number);
/** Fleet capacity in requests per wall second, measured first (closed loop). */
let cap = 0;
const jain = (xs: number[]) => {
  const sum = xs.reduce((a, b) => a + b, 0);
  const sq = xs.reduce((a, b) => a + b * b, 0);
  return sq === 0 ? null : Number(((sum * sum) / (xs.length * sq)).toFixed(3));
};

/** Per server URL, every round's high-band TTFTs (unloaded: before and after) and low-band counts. */
const samples = new Map<
  string,
  { unloaded: number[]; loaded: number[]; lowOffered: number; lowDone: number }
>();

/**
 * Over every round of a server, pooled: the high band's TTFT p90 unloaded (before and after
 * together) and loaded, their ratio, the low band's completion. Steadier than one round's
 * ratio on a box whose load swings (a 10 s phase holds ~80 high-band requests).
 */
function pooled(url: string) {
  const x = samples.get(url);
  if (!x) return null;
  const u = p90(x.unloaded);
  const l = p90(x.loaded);
  return {
    highUnloadedN: x.unloaded.length,
    highTtftP90UnloadedMs: u,
    highTtftP90LoadedMs: l,
    highLoadedOverUnloaded: u && l !== null ? Number((l / u).toFixed(2)) : null,
    lowCompleted: Number((x.lowDone / Math.max(1, x.lowOffered)).toFixed(3)),
  };
}

/** High band alone, with the low band at 2× capacity, alone again; on one server. */
async function bandsPhase(url: string, engines: Engine[], load: () => string) {
  const pre0 = (await engineCounters(engines)).reduce((a, c) => a + c.preemptions, 0);
  const high = { band: "high", tenant: "h", rps: 0.4 * cap };
  const alone = await openLoop(url, [high]);
  const mixed = await openLoop(url, [high, { band: "low", tenant: "l", rps: 1.6 * cap }]);
  const pre1 = (await engineCounters(engines)).reduce((a, c) => a + c.preemptions, 0);
  const after = await openLoop(url, [high]);
  const lows = mixed.filter((s) => s.band === "low");
  const unloaded = p90(ttfts(alone, () => true));
  const loaded = p90(ttfts(mixed, (s) => s.band === "high"));
  const unloadedAfter = p90(ttfts(after, () => true));
  samples.set(url, {
    unloaded: [
      ...(samples.get(url)?.unloaded ?? []),
      ...ttfts(alone, () => true),
      ...ttfts(after, () => true),
    ],
    loaded: [...(samples.get(url)?.loaded ?? []), ...ttfts(mixed, (s) => s.band === "high")],
    lowOffered: (samples.get(url)?.lowOffered ?? 0) + lows.length,
    lowDone: (samples.get(url)?.lowDone ?? 0) + lows.filter((s) => s.status === 200).length,
  });
  return {
    highTtftP90UnloadedMs: unloaded,
    highTtftP90LoadedMs: loaded,
    highTtftP90UnloadedAfterMs: unloadedAfter,
    highLoadedOverUnloaded: loaded !== null && unloaded ? Number((loaded / unloaded).toFixed(2)) : null,
    highLoadedOverUnloadedAfter:
      loaded !== null && unloadedAfter ? Number((loaded / unloadedAfter).toFixed(2)) : null,
    highRejected: mixed.filter((s) => s.band === "high" && s.status !== 200).length,
    lowOffered: lows.length,
    lowCompleted: Number((lows.filter((s) => s.status === 200).length / Math.max(1, lows.length)).toFixed(3)),
    preemptions: pre1 - pre0,
    load: load(),
  };
}

/** Per numeric field of the bands phase, the median over rounds. */
function medians(runs: readonly Record<string, unknown>[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of Object.keys(runs[0] ?? {})) {
    const xs = runs.map((r) => Number(r[k])).filter((x) => Number.isFinite(x));
    if (xs.length === 0) continue;
    xs.sort((a, b) => a - b);
    const m = xs.length >> 1;
    out[k] = xs.length % 2 ? xs[m] : (xs[m - 1] + xs[m]) / 2;
  }
  return out;
}

/** Three light tenants alone, with a heavy one at 4× a fair share, then four backlogged. */
async function tenantsPhase(url: string, load: () => string) {
  const light = ["a", "b", "c"].map((t) => ({ band: "normal", tenant: t, rps: 0.2 * cap }));
  const lightAlone = await openLoop(url, light);
  const withHeavy = await openLoop(url, [...light, { band: "normal", tenant: "heavy", rps: 1.0 * cap }]);
  const backlogged = await openLoop(
    url,
    ["a", "b", "c", "d"].map((t) => ({ band: "normal", tenant: t, rps: 1.0 * cap })),
  );
  return {
    lightTtftP90AloneMs: p90(ttfts(lightAlone, () => true)),
    lightTtftP90WithHeavyMs: p90(ttfts(withHeavy, (s) => s.tenant !== "heavy")),
    jainBacklogged: jain(
      ["a", "b", "c", "d"].map((t) =>
        backlogged.filter((s) => s.tenant === t).reduce((a, s) => a + s.outputTokens, 0),
      ),
    ),
    load: load(),
  };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "infera-flow-bench-"));
  const engines = await startEngines(WORKERS, [
    "--speed",
    String(SPEED),
    ...(ENGINE_PRIORITY ? ["--scheduling-policy", "priority"] : []),
  ]);
  const kill: Array<() => void> = [() => void engines.close()];
  handleFatalSignals();
  const workersFile = writeWorkersFile(dir, engines.engines, 16);
  const server = async (flow: boolean, params: Record<string, unknown> = loadParams) => {
    const port = await freePort();
    const cfg = join(dir, `cfg-${port}.json`);
    const bands = [{ name: "high" }, { name: "normal" }, { name: "low" }];
    writeFileSync(
      cfg,
      JSON.stringify({
        flow: {
          enabled: flow,
          tenantHeader: true,
          maxWaitMs: 20_000,
          bands,
          ...(Object.keys(params).length > 0 ? { headroom: [{ name: "load", params }] } : {}),
        },
      }),
    );
    const { proc, output } = spawnInfera(
      serverArgs(
        port,
        "--workers-file",
        workersFile,
        "--policy",
        "kv-aware",
        "--scrape-interval",
        "200",
        "--config",
        cfg,
      ),
      { logLevel: "warn", keepChars: 4000 },
    );
    killOnExit(proc);
    kill.push(() => proc.kill("SIGKILL"));
    const url = `http://127.0.0.1:${port}`;
    await waitFor200(`${url}/ready`, { timeoutMs: 60_000, what: "server", output });
    return url;
  };
  const servers: Record<string, string> = { "kv-aware": await server(false) };
  if (VARIANTS)
    for (const [name, params] of Object.entries(VARIANTS))
      servers[`kv-aware+${name}`] = await server(true, params);
  else servers["kv-aware+flow"] = await server(true);
  const load = () => loadavg()[0].toFixed(1);
  cap = await capacity(servers["kv-aware"]);
  console.log(`capacity ${cap.toFixed(2)} req/s (wall), load ${load()}`);
  const results: Record<string, unknown> = { workers: WORKERS, speed: SPEED, capacityRps: cap };
  // Bands: the servers take turns, `--repeat` rounds, so a drift of the box's load hits both.
  const bandRuns: Record<string, Awaited<ReturnType<typeof bandsPhase>>[]> = {};
  for (let r = 0; PHASES.has("bands") && r < REPEAT; r++)
    for (const [name, url] of Object.entries(servers)) {
      const b = await bandsPhase(url, engines.engines, load);
      bandRuns[name] = [...(bandRuns[name] ?? []), b];
      console.log(name, `round ${r + 1}`, JSON.stringify(b));
    }
  for (const [name, url] of Object.entries(servers)) {
    const runs = bandRuns[name] ?? [];
    const tenants = PHASES.has("tenants") ? await tenantsPhase(url, load) : null;
    const bandsPooled = runs.length > 1 ? pooled(url) : null;
    results[name] = {
      bands: runs[0] ?? null,
      ...(runs.length > 1 ? { bandRounds: runs, bandsMedian: medians(runs), bandsPooled } : {}),
      tenants,
    };
    if (runs.length > 1) {
      console.log(name, "median over rounds", JSON.stringify(medians(runs)));
      console.log(name, "pooled over rounds", JSON.stringify(bandsPooled));
    }
    if (tenants) console.log(name, JSON.stringify({ tenants }));
  }
  writeFileSync(OUT, `${JSON.stringify(results, null, 2)}\n`);
  for (const k of kill) k();
  rmSync(dir, { recursive: true, force: true });
}

await main();
process.exit(0);
