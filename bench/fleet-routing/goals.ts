/**
 * Issue #28's routing goals in one command: the multi-turn generator's trace (./generate.ts,
 * kind chat) replayed at 0.7× and 1.5× of the fleet's prefill capacity through 8 simulated
 * Qwen3-32B/TP2 workers, with 1 and 4 server replicas, every policy side by side in one run.
 *
 *   node bench/fleet-routing/goals.ts [--quick] [--policies kv-aware,approx-prefix,round-robin,kv-aware-classic]
 *     [--loads 0.7,1.5] [--replicas 1,4] [--speed 0.2] [--window-s 10] [--warm-s 60] [--seed 28]
 *     [--max-output 32] [--workers 8] [--kv-blocks N] [--slo-ttft-ms 2000] [--slo-itl-ms 50] [--out DIR]
 *
 * Issue #29's multi-turn goal (Runs I and J in RESULTS.md): `--loads 2 --replicas 1 --policies
 * kv-aware,kv-aware+flow,kv-aware+flow-local,kv-aware+flow-ttft --slo-itl-ms 100` (the flow
 * variants, `-local` with flow control's locality: ./servers.ts).
 *
 * The trace: chat sessions (Poisson starts, whole history re-sent each turn, short think times)
 * at a session rate chosen so that the trace at time scale 1 offers about 1× the fleet's prefill
 * capacity, cut to a --window-s model-second window after --warm-s seconds of sessions (steady
 * state; sessions that began before the window have earlier turns outside it, as in a recorded
 * window). Each load then replays it at the time scale that gives that load (./trace-stats.ts).
 * Pools: the profile's full KV pool per worker. Answers are cut to --max-output tokens (the next
 * turn's prompt still holds the trace's whole answer): streaming every answer in full does not fit
 * the box, and the goals are about prefill (hits, TTFT). Policies are passed to the servers as given
 * (a policy the servers do not know is reported as skipped); round-robin holds no state, so it
 * runs with 1 replica only and stands in both tables. Times are model time (wall × --speed).
 *
 * Goals checked per kv-aware* policy: prefix hit ≥ approx-prefix's with 1 replica and ≥ 1.2×
 * with 4, ≥ 90 % of the fleet-wide LRU figure in every case, and TTFT p90 ≤ 0.8× approx-prefix's
 * at 0.7×; per flow-control variant (`…+flow…`), goodput ≥ 1.5× kv-aware's and engine preemptions
 * ≤ 10 % of kv-aware's in the same case (429s count as not good). Output: the tables, the goal checks, goals-results.json (goals-results-quick.json
 * with --quick) and the trace itself (goals-trace.jsonl). Sized for the 2-core box: the full run (a
 * 10-model-second window at --speed 0.2) ≤ 30 min, --quick (2 model s) ≤ 5 min on a quiet box.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { handleFatalSignals } from "../../src/util/child-process.ts";
import { exitWithUsageIfAsked } from "../usage.ts";
import { startEngines } from "./engines.ts";
import { type GenOptions, generate, MOONCAKE_BLOCK, summarize, type TraceLine, toJsonl } from "./generate.ts";
import { writeWorkersFile } from "./servers.ts";
import {
  describeCase,
  prepareCase,
  printTraceTable,
  type RunContext,
  runTraceOnce,
  statsSummary,
  type TraceCase,
  type TraceRun,
  traceRequests,
} from "./trace-run.ts";
import { type PrefillModel, prefillSeconds, traceStats } from "./trace-stats.ts";

const args = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, args);
const quick = args.includes("--quick");
const str = (name: string, def: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const list = (name: string, def: string) => str(name, def).split(",").filter(Boolean);
const HERE = fileURLToPath(new URL(".", import.meta.url));
const OUT = str("out", HERE);
const PROFILE_PATH = str("profile", join(HERE, "qwen3-32b-tp2-h100.json"));
const profile = JSON.parse(readFileSync(PROFILE_PATH, "utf8")) as PrefillModel & { num_gpu_blocks: number };
const WORKERS = Number(str("workers", "8"));
/** KV blocks per worker: the profile's pool unless --kv-blocks (a smaller pool preempts sooner). */
const BLOCKS = Number(str("kv-blocks", String(profile.num_gpu_blocks)));
const BS = 16;
const SPEED = Number(str("speed", "0.2"));
const WINDOW_S = Number(str("window-s", quick ? "2" : "10"));
/** Decode shortened to this many tokens (the prompts keep the trace's whole answers). */
const MAX_OUTPUT = Number(str("max-output", "32"));
const WARM_S = Number(str("warm-s", "60"));
const SEED = Number(str("seed", "28"));
const LOADS = list("loads", "0.7,1.5").map(Number);
const REPLICAS = list("replicas", "1,4").map(Number);
const POLICIES = list("policies", "kv-aware,approx-prefix,round-robin,kv-aware-classic");
const STATELESS = new Set(["round-robin", "random"]);
const SLO = { ttftMs: Number(str("slo-ttft-ms", "2000")), itlMs: Number(str("slo-itl-ms", "50")) };
const log = (s: string) => process.stderr.write(`[goals ${new Date().toISOString().slice(11, 19)}] ${s}\n`);

/**
 * The chat trace at a session rate that offers about 1× capacity at time scale 1: a pilot at
 * 10 sessions/s estimates the load from its 512-block ids (no tokenizer), and the rate scales.
 */
function buildTrace(): TraceLine[] {
  const opts = (rate: number): GenOptions => ({
    kind: "chat",
    seed: SEED,
    sessions: Math.ceil(rate * (WARM_S + WINDOW_S)),
    durationS: WARM_S + WINDOW_S,
    tenants: 16,
    zipf: 1,
    preambleBlocks: 1,
    thinkS: 2,
    window: [WARM_S, WARM_S + WINDOW_S],
  });
  const estLoad = (lines: readonly TraceLine[]) => {
    const seen = new Map<number, number>();
    let work = 0;
    for (const l of lines) {
      let cached = 0;
      let prefix = true;
      l.hash_ids.forEach((h, k) => {
        const size = Math.min(MOONCAKE_BLOCK, l.input_length - k * MOONCAKE_BLOCK);
        const had = seen.get(h) ?? 0;
        if (prefix) cached += Math.min(had, size);
        prefix &&= had >= size;
        if (size > had) seen.set(h, size);
      });
      work += prefillSeconds(profile, l.input_length, cached);
    }
    return work / WINDOW_S / WORKERS;
  };
  const pilotRate = 10;
  const pilot = estLoad(generate(opts(pilotRate)));
  const rate = pilotRate / Math.max(pilot, 1e-6);
  const lines = generate(opts(rate));
  log(
    `chat trace: ${rate.toFixed(1)} sessions/s (pilot at ${pilotRate}/s offered ${pilot.toFixed(2)}×); ${summaryLine(lines)}`,
  );
  return lines;
}

function summaryLine(lines: readonly TraceLine[]): string {
  const s = summarize(lines);
  return `${s.requests} requests over ${s.spanS.toFixed(1)} s, mean prompt ${s.meanPrompt.toFixed(0)}, mean output ${s.meanOutput.toFixed(0)}, ideal reuse ${(100 * s.idealReuse).toFixed(1)}% (512-token blocks)`;
}

interface GoalCheck {
  goal: string;
  figure: string;
  ok: boolean | null;
}

function checks(cases: readonly TraceCase[], runs: readonly TraceRun[]): GoalCheck[] {
  const out: GoalCheck[] = [];
  const pc = (x: number) => `${(100 * x).toFixed(1)}%`;
  const find = (c: string, p: string, n: number) =>
    runs.find((r) => r.case === c && r.policy === p && r.replicas === n);
  const kvs = [...new Set(runs.map((r) => r.policy))].filter((p) => p.startsWith("kv-aware"));
  for (const kv of kvs)
    for (const c of cases)
      for (const n of REPLICAS) {
        const k = find(c.name, kv, n);
        const a = find(c.name, "approx-prefix", n);
        const where = `${c.name}, ${n} replica${n > 1 ? "s" : ""}`;
        if (!k) continue;
        const min = n > 1 ? 1.2 : 1;
        out.push({
          goal: `${kv} hit ≥ ${min}× approx-prefix's (${where})`,
          figure: a
            ? `${pc(k.fig.hitRate)} vs ${pc(a.fig.hitRate)} (${(k.fig.hitRate / Math.max(a.fig.hitRate, 1e-9)).toFixed(2)}×)`
            : "approx-prefix not run",
          ok: a && k.fig.ok > 0 && a.fig.ok > 0 ? k.fig.hitRate >= min * a.fig.hitRate : null,
        });
        out.push({
          goal: `${kv} hit ≥ 90% of the fleet-wide LRU (${where})`,
          figure: `${pc(k.fig.hitRate)} = ${pc(k.ofLru)} of ${pc(k.lruRate)}`,
          ok: k.fig.ok > 0 ? k.ofLru >= 0.9 : null,
        });
        if (c.load < 1 && a)
          out.push({
            goal: `${kv} TTFT p90 ≤ 0.8× approx-prefix's (${where})`,
            figure: `${(k.fig.ttftP90 / 1000).toFixed(2)} vs ${(a.fig.ttftP90 / 1000).toFixed(2)} s (${(k.fig.ttftP90 / a.fig.ttftP90).toFixed(2)}×)`,
            ok: k.fig.ttftP90 <= 0.8 * a.fig.ttftP90,
          });
      }
  for (const c of cases)
    for (const n of REPLICAS) {
      const base = find(c.name, "kv-aware", n);
      for (const r of runs.filter(
        (x) => x.case === c.name && x.replicas === n && x.policy.includes("+flow"),
      )) {
        const where = `${c.name}, ${n} replica${n > 1 ? "s" : ""}`;
        out.push({
          goal: `${r.policy} goodput (TTFT ≤ ${SLO.ttftMs / 1000} s, TPOT ≤ ${SLO.itlMs} ms) ≥ 1.5× kv-aware's (${where})`,
          figure: base
            ? `${r.fig.goodput.toFixed(2)} vs ${base.fig.goodput.toFixed(2)}/s (${(r.fig.goodput / Math.max(base.fig.goodput, 1e-9)).toFixed(2)}×)`
            : "kv-aware not run",
          ok: base ? r.fig.goodput >= 1.5 * base.fig.goodput : null,
        });
        out.push({
          goal: `${r.policy} engine preemptions ≤ 10% of kv-aware's (${where})`,
          figure: base ? `${r.preemptions} vs ${base.preemptions}` : "kv-aware not run",
          // None to cut when kv-aware did not preempt either: not exercised.
          ok: base && base.preemptions > 0 ? r.preemptions <= 0.1 * base.preemptions : null,
        });
      }
    }
  return out;
}

async function main(): Promise<void> {
  handleFatalSignals();
  const t0 = Date.now();
  log(
    `${quick ? "quick: " : ""}loads ${LOADS.join(",")}, replicas ${REPLICAS.join(",")}, policies ${POLICIES.join(",")}; ${WORKERS} workers × ${BLOCKS} blocks, --speed ${SPEED}, window ${WINDOW_S} model s; ${cpus().length} CPUs, load ${loadavg()
      .map((x) => x.toFixed(1))
      .join(" ")}`,
  );
  const lines = buildTrace();
  const traceFile = join(OUT, quick ? "goals-trace-quick.jsonl" : "goals-trace.jsonl");
  writeFileSync(traceFile, toJsonl(lines));
  const reqs = traceRequests(toJsonl(lines).split("\n"), { maxOutput: MAX_OUTPUT });
  const tok = getDefaultTokenizer();
  const stats = traceStats(reqs, {
    tok,
    blockSize: BS,
    fleetBlocks: BLOCKS * WORKERS,
    model: profile,
  });
  const cases = LOADS.map((load) =>
    prepareCase(`chat ${load}×`, reqs, {
      tok,
      blockSize: BS,
      workers: WORKERS,
      blocksPerEngine: BLOCKS,
      model: profile,
      load,
      stats,
    }),
  );
  for (const c of cases) log(describeCase(c));
  const dir = mkdtempSync(join(tmpdir(), "fleet-goals-"));
  const engines = await startEngines(WORKERS, [
    ...["--block-size", String(BS), "--num-gpu-blocks", String(BLOCKS)],
    ...["--speed", String(SPEED), "--profile", PROFILE_PATH],
  ]);
  const runs: TraceRun[] = [];
  const skipped: string[] = [];
  try {
    const ctx: RunContext = {
      engines,
      workersFile: writeWorkersFile(dir, engines.engines, BS),
      dir,
      speed: SPEED,
      slo: SLO,
      seed: SEED,
      drainS: quick ? 5 : 10,
      readyTimeoutMs: 90_000,
      log,
    };
    const plan: Array<[TraceCase, string, number]> = [];
    for (const c of cases)
      for (const n of REPLICAS)
        for (const p of POLICIES) if (!(STATELESS.has(p) && n !== REPLICAS[0])) plan.push([c, p, n]);
    for (const [i, [c, p, n]] of plan.entries()) {
      if (skipped.includes(p)) continue;
      log(
        `run ${i + 1}/${plan.length}: ${c.name} ${p} × ${n} (${((Date.now() - t0) / 60000).toFixed(1)} min so far)`,
      );
      try {
        runs.push(await runTraceOnce(ctx, c, p, n));
      } catch (e) {
        // A policy this checkout's server does not know (e.g. kv-aware-classic before L1 lands).
        log(`${p}: skipped, the server did not start: ${String(e).split("\n")[0].slice(0, 300)}`);
        skipped.push(p);
      }
      writeResults(cases, runs, skipped, null, traceFile);
    }
  } finally {
    await engines.close();
    rmSync(dir, { recursive: true, force: true });
  }
  for (const c of cases) {
    console.log(`\n${describeCase(c)}`);
    for (const n of REPLICAS)
      printTraceTable(
        { ...c, name: `${c.name}, ${n} replica${n > 1 ? "s" : ""}` },
        runs.filter((r) => r.case === c.name && (r.replicas === n || STATELESS.has(r.policy))),
      );
  }
  const g = checks(cases, runs);
  console.log("\n| goal | figure | |\n|---|---|---|");
  for (const x of g)
    console.log(`| ${x.goal} | ${x.figure} | ${x.ok === null ? "n/a" : x.ok ? "met" : "MISSED"} |`);
  if (skipped.length > 0)
    console.log(`\nskipped (the servers did not start with them): ${skipped.join(", ")}`);
  writeResults(cases, runs, skipped, g, traceFile);
  console.log(
    `\nwrote ${resultsFile()} and ${traceFile}; ${((Date.now() - t0) / 60000).toFixed(1)} min wall, load ${loadavg()
      .map((x) => x.toFixed(1))
      .join(" ")}`,
  );
}

const resultsFile = () => join(OUT, quick ? "goals-results-quick.json" : "goals-results.json");

function writeResults(
  cases: readonly TraceCase[],
  runs: readonly TraceRun[],
  skipped: readonly string[],
  g: GoalCheck[] | null,
  traceFile: string,
): void {
  const settings = {
    quick,
    workers: WORKERS,
    speed: SPEED,
    maxOutput: MAX_OUTPUT,
    windowS: WINDOW_S,
    warmS: WARM_S,
    seed: SEED,
    blocksPerEngine: BLOCKS,
    loads: LOADS,
    replicas: REPLICAS,
    policies: POLICIES,
    slo: SLO,
    cpus: cpus().length,
  };
  const body = {
    created_at: new Date().toISOString(),
    settings,
    trace: traceFile.replace(HERE, "bench/fleet-routing/"),
    cases: cases.map((c) => ({
      name: c.name,
      load: c.load,
      timeScale: c.timeScale,
      stats: statsSummary(c.stats),
    })),
    runs,
    skipped,
    goals: g,
  };
  writeFileSync(resultsFile(), `${JSON.stringify(body, null, 1)}\n`);
}

await main();
