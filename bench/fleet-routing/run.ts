/**
 * Fleet routing under load (issue #19): llm-d's precise-prefix-cache benchmark shape — T tenants
 * with one long shared prefix each and short questions, Poisson arrivals stepped up past the
 * fleet's saturation — through `infera server` (1, 2 or 4 replicas behind a balancer) over one
 * `infera-sim --fleet N` process whose pools hold the working set only when tenants are
 * partitioned (fleet total ≈ 1.5× the working set).
 *
 *   node bench/fleet-routing/run.ts [--quick] [--workers 8,16] [--tenants 64] [--prefix 6000]
 *     [--rates 8,16,24,32,40] [--big-rates 8,24,40] [--step-s 6] [--drain-s 15] [--warm-rate 8]
 *     [--speed 0.5] [--big-speed 0.25] [--kv-replicas 1,2,4] [--approx-replicas 1,4]
 *     [--other-replicas 1]
 *     [--policies round-robin,approx-prefix,kv-aware,kv-aware-classic,kv+queue]
 *     [--big-policies round-robin,kv-aware] [--hot-rate 24] [--hot-policies kv-aware,kv-aware-classic,kv+queue]
 *     [--profile F] [--out DIR] [--no-share]
 *   node bench/fleet-routing/run.ts --trace FILE[,FILE] [--workers 8] [--replicas 1,4]
 *     [--policies round-robin,approx-prefix,kv-aware,kv-aware-classic] [--load 0.7 | --time-scale F] [--speed 0.25]
 *     [--kv-blocks N | --kv-fraction X] [--limit N] [--max-output N] [--drain-s 30] [--out DIR] [--dry]
 *
 * --trace replays Mooncake-format or OpenAI-format JSONL traces instead of the llm-d shape
 * (./trace-run.ts): the trace's ideal reuse, a fleet-wide LRU's, and each policy's hit rate as a
 * fraction of both, TTFT, goodput, preemptions; trace-results.json. --load L replays the trace at
 * L × the fleet's prefill capacity. Generators of such traces: ./generate.ts; the issue #28 goal
 * runner: ./goals.ts.
 *
 * Several replicas share their routing state (the pending bridge's routed prefixes) over a ZMQ
 * mesh among them (src/router/peers); --no-share turns that off, for comparison with Run F.
 *
 * The full llm-d shape: --tenants 150. Rates are per model second for 8 workers and scale with
 * the worker count (the first count runs --rates, the others --big-rates). Each policy × replica
 * count: reset caches, a warm-up (one request per tenant), then the rate stages back to back.
 * Latencies and rates are in model time (wall × --speed). Output: results.json, plot.html
 * (results-quick.json, plot-quick.html with --quick) and the tables on stdout. --help prints
 * this and exits. Interrupted (SIGINT, SIGTERM, SIGHUP, or stdout a closed pipe), it stops the
 * fleet and the server replicas before exiting.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { runBench } from "../../src/loadgen/index.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { handleFatalSignals } from "../../src/util/child-process.ts";
import { exitWithUsageIfAsked } from "../usage.ts";
import { cpuSeconds, type Engines, engineCounters, resetCaches, startEngines } from "./engines.ts";
import { type Goal, goals, printGoals, printHeadline, printSteps, renderHtml } from "./report.ts";
import { COMPOSED_NAME, decisionsOf, MODEL, startReplicas, writeWorkersFile } from "./servers.ts";
import {
  type CpuShare,
  type HotRecord,
  type RunRecord,
  type Slo,
  type StepFigures,
  stepFigures,
} from "./stats.ts";
import { buildStep, buildWarmup, type Reuse, ReuseTracker, tenantPrefixes } from "./trace.ts";

const args = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, args);
const has = (name: string) => args.includes(`--${name}`);
const str = (name: string, def: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const num = (name: string, def: number) => Number(str(name, String(def)));
const list = (name: string, def: string) => str(name, def).split(",").filter(Boolean);
const quick = has("quick");
/** Replicas share routing state (src/router/peers) unless --no-share. */
const SHARE = !has("no-share");

const HERE = fileURLToPath(new URL(".", import.meta.url));
const OUT = str("out", HERE);
const BS = num("block-size", 16);
/** Sim speed of the first worker count, and of the others (more engines, twice the rates). */
const SPEED = num("speed", quick ? 1 : 0.5);
const BIG_SPEED = num("big-speed", 0.25);
const speedFor = (w: number) => (w === WORKERS[0] ? SPEED : BIG_SPEED);
const PROFILE = str("profile", join(HERE, "qwen3-32b-tp2-h100.json"));
const WORKERS = list("workers", quick ? "8" : "8,16").map(Number);
const TENANTS = num("tenants", quick ? 32 : 64);
const PREFIX = num("prefix", 6000);
const QUESTION = num("question", 64);
const MAX_TOKENS = num("max-tokens", 24);
/** Offered rates (requests per model second) for 8 workers; ×(workers / 8) for other counts. */
const RATES = list("rates", quick ? "8,40" : "8,16,24,32,40").map(Number);
/** The rates of the runs past the first worker count (per 8 workers, scaled alike). */
const BIG_RATES = list("big-rates", "8,24,40").map(Number);
/** Model seconds of arrivals per stage, and wall seconds the run waits for its backlog after the last. */
const STEP_S = num("step-s", 6);
const DRAIN_S = num("drain-s", quick ? 10 : 15);
const POLICIES = list(
  "policies",
  quick
    ? "round-robin,approx-prefix,kv-aware"
    : `round-robin,approx-prefix,kv-aware,kv-aware-classic,${COMPOSED_NAME}`,
);
const KV_REPLICAS = list("kv-replicas", quick ? "1,4" : "1,2,4").map(Number);
/** Replica counts for the other policies. */
const OTHER_REPLICAS = list("other-replicas", "1").map(Number);
/** approx-prefix's replica counts: with several, each replica's tree sees only its share. */
const APPROX_REPLICAS = list("approx-replicas", quick ? "1" : "1,4").map(Number);
/** Policies at 16+ workers (the costliest part of a run). */
const BIG_POLICIES = list("big-policies", "round-robin,kv-aware");
const HOT_RATE = num("hot-rate", 24);
/** Warm-up before the stages: one request per tenant at this rate (per model second). */
const WARM_RATE = num("warm-rate", 8);
const HOT_POLICIES = list("hot-policies", quick ? "kv-aware" : `kv-aware,kv-aware-classic,${COMPOSED_NAME}`);
const SEED = num("seed", 19);
const SLO: Slo = { ttftMs: num("slo-ttft-ms", 2000), itlMs: num("slo-itl-ms", 50) };
const READY_TIMEOUT_MS = num("ready-timeout", 90) * 1000;
const NCPU = cpus().length;

const tok = getDefaultTokenizer();
const prefixes = tenantPrefixes({ seed: SEED, tenants: TENANTS, prefixWords: PREFIX });
const log = (s: string) =>
  process.stderr.write(`[fleet-routing ${new Date().toISOString().slice(11, 19)}] ${s}\n`);

/** Blocks per engine: the fleet holds 1.5× the working set (every tenant's prefix once). */
function blocksPerEngine(workers: number): number {
  const working = Math.ceil((PREFIX + 40) / BS) * TENANTS;
  return Math.ceil((1.5 * working) / workers);
}

function cpuNow(pids: readonly number[]): number {
  let t = 0;
  for (const p of pids) t += cpuSeconds(p);
  return t;
}

/** Waits until no engine runs or queues a request (a given-up backlog being aborted). */
async function waitIdle(engines: Engines, limitMs = 30_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const busy = await Promise.all(
      engines.engines.map(async (e) => {
        try {
          const t = await (await fetch(`${e.url}/metrics`)).text();
          return /^vllm:num_requests_(running|waiting)\{[^}]*\} [1-9]/m.test(t);
        } catch (err) {
          // A busy engine may reset a scrape; ask again (until the deadline).
          log(
            `waitIdle: ${e.url}/metrics: ${String(err)}${engines.alive() ? "" : `; the engines exited: ${engines.output()}`}`,
          );
          return true;
        }
      }),
    );
    if (!busy.some(Boolean) || Date.now() > deadline) return;
    await new Promise((r) => setTimeout(r, 200));
  }
}

interface Stage {
  rate: number;
  reqs: ReturnType<typeof buildStep>;
  reuse: Reuse;
  /** Wall ms the stage lasts (its arrivals' window). */
  durationMs: number;
}

/**
 * Rate stages back to back through the balancer at `url`, as llm-d's benchmark runs its load
 * stages: one open-loop arrival stream whose rate steps up every STEP_S model seconds, with no
 * pause between stages, so a backlog a policy builds in one stage is still there in the next.
 * After the last stage the run waits DRAIN_S (wall) for its backlog, then gives up on the rest:
 * those requests count as unfinished, with the time they had waited as their TTFT (a lower bound).
 * Figures are per stage, over the requests that arrived in it; CPU over the stage's window.
 */
async function runStages(
  url: string,
  stages: readonly Stage[],
  engines: Engines,
  serverPids: readonly number[],
  label: string,
  speed: number,
): Promise<StepFigures[]> {
  const all: ReturnType<typeof buildStep> = [];
  const offsets: number[] = [];
  /** Wall ms from the run start to each stage's start, and to the end of the last. */
  const starts: number[] = [0];
  for (const [k, st] of stages.entries()) {
    offsets.push(all.length);
    for (const r of st.reqs)
      all.push({
        ...r,
        index: all.length,
        arrivalMs: (r.arrivalMs ?? 0) + starts[k],
        group: `${r.group}@${k}`,
      });
    starts.push(starts[k] + st.durationMs);
  }
  const endMs = starts[stages.length];
  const ac = new AbortController();
  let abortMs = Number.POSITIVE_INFINITY;
  const started = performance.now();
  const timer = setTimeout(
    () => {
      abortMs = performance.now() - started;
      ac.abort();
    },
    endMs + DRAIN_S * 1000,
  );
  // CPU counters at every stage boundary (and at the end of the run).
  const marks: Array<{ fleet: number; servers: number; bench: number; at: number; load: number }> = [];
  const mark = () => {
    const u = process.cpuUsage();
    marks.push({
      fleet: cpuNow(engines.pids),
      servers: cpuNow(serverPids),
      bench: (u.user + u.system) / 1e6,
      at: performance.now(),
      load: loadavg()[0],
    });
  };
  mark();
  const timers = stages.slice(1).map((_, k) =>
    setTimeout(
      () => {
        mark();
        log(`${label}: stage ${k + 2}/${stages.length}, ${stages[k + 1].rate}/s`);
      },
      starts[k + 1],
    ),
  );
  let lastLog = 0;
  const result = await runBench({
    url,
    model: MODEL,
    workload: all,
    stream: true,
    seed: SEED,
    timeoutMs: endMs + DRAIN_S * 1000 + 60_000,
    label,
    signal: ac.signal,
    onProgress: (p) => {
      if (p.elapsedMs - lastLog < 10_000) return;
      lastLog = p.elapsedMs;
      log(
        `  ${label}: ${p.done}/${p.total} done, ${p.inFlight} in flight, ${(p.elapsedMs / 1000).toFixed(0)} s`,
      );
    },
  });
  clearTimeout(timer);
  for (const t of timers) clearTimeout(t);
  mark();
  const out: StepFigures[] = [];
  for (const [k, st] of stages.entries()) {
    const a = marks[k];
    // The last stage's CPU window runs to the end of the drain.
    const b = marks[Math.min(k + 1, marks.length - 1)];
    const wallS = (b.at - a.at) / 1000;
    const cpu: CpuShare = {
      fleetCore: (100 * (b.fleet - a.fleet)) / wallS,
      fleetBox: (100 * (b.fleet - a.fleet)) / wallS / NCPU,
      serversCore: (100 * (b.servers - a.servers)) / wallS,
      benchCore: (100 * (b.bench - a.bench)) / wallS,
      load1: b.load,
    };
    const lo = offsets[k];
    const hi = lo + st.reqs.length;
    const recs = result.requests
      .filter((r) => r.index >= lo && r.index < hi)
      .map((r) => ({ ...r, index: r.index - lo }));
    out.push(stepFigures(st.rate, recs, st.reqs.length, st.reuse, { speed, slo: SLO, abortMs, wallS, cpu }));
  }
  await waitIdle(engines);
  return out;
}

function stepLine(label: string, f: StepFigures): string {
  return `${label} rate ${f.rate}/s: TTFT p50/p90/p99 ${f.ttftP50.toFixed(0)}/${f.ttftP90.toFixed(0)}/${f.ttftP99.toFixed(0)} ms, ITL p50 ${f.itlP50.toFixed(1)} ms, ${f.throughput.toFixed(1)} req/s, goodput ${f.goodput.toFixed(1)}, hit ${(100 * f.hitRate).toFixed(1)}% (${(100 * f.ofReachable).toFixed(0)}% of reachable), unfinished ${f.unfinished}, fleet CPU ${f.cpu.fleetCore.toFixed(0)}% of a core, servers ${f.cpu.serversCore.toFixed(0)}%, load ${f.cpu.load1.toFixed(1)}, ${f.wallS.toFixed(0)} s`;
}

async function main(): Promise<void> {
  // Interrupted (a signal, or stdout piped to `head` that went away): stop the fleet and the
  // server replicas first; each registers itself with killOnExit when it is spawned.
  handleFatalSignals();
  const t0 = Date.now();
  const scaleRates = (w: number) =>
    (w === WORKERS[0] ? RATES : BIG_RATES).map((r) => +((r * w) / 8).toFixed(2));
  const stepTraces = new Map<number, Stage[]>();
  const warmStage = (tracker: ReuseTracker, speed: number): Stage => {
    const reqs = buildWarmup(prefixes, {
      seed: SEED,
      rate: WARM_RATE * speed,
      questionWords: QUESTION,
      maxTokens: MAX_TOKENS,
    });
    return {
      rate: WARM_RATE,
      reqs,
      reuse: tracker.add(reqs),
      durationMs: (reqs[reqs.length - 1]?.arrivalMs ?? 0) + 1,
    };
  };
  for (const w of WORKERS) {
    const tracker = new ReuseTracker(tok, BS);
    const speed = speedFor(w);
    const warm = warmStage(tracker, speed);
    stepTraces.set(w, [
      warm,
      ...scaleRates(w).map((rate) => {
        const reqs = buildStep(prefixes, {
          seed: SEED,
          rate: rate * speed,
          durationS: STEP_S / speed,
          questionWords: QUESTION,
          maxTokens: MAX_TOKENS,
        });
        return { rate, reqs, reuse: tracker.add(reqs), durationMs: (STEP_S / speed) * 1000 };
      }),
    ]);
  }
  log(
    `${TENANTS} tenants × ${PREFIX}-word prefixes, ${QUESTION}-word questions, max_tokens ${MAX_TOKENS}; workers ${WORKERS.join(",")}; rates ${RATES.join(",")}/s per 8 workers, ${STEP_S} model s each; --speed ${WORKERS.map(speedFor).join(",")}; profile ${PROFILE}; ${NCPU} CPUs, load ${loadavg()
      .map((x) => x.toFixed(1))
      .join(" ")}`,
  );
  const dir = mkdtempSync(join(tmpdir(), "fleet-routing-"));
  const runs: RunRecord[] = [];
  const hot: HotRecord[] = [];
  let engines: Engines | null = null;
  try {
    for (const w of WORKERS) {
      const blocks = blocksPerEngine(w);
      engines = await startEngines(w, [
        "--block-size",
        String(BS),
        "--num-gpu-blocks",
        String(blocks),
        "--speed",
        String(speedFor(w)),
        "--profile",
        PROFILE,
      ]);
      log(`${w} engines (${engines.mode}, pids ${engines.pids.join(",")}) × ${blocks} blocks of ${BS}`);
      const workersFile = writeWorkersFile(dir, engines.engines, BS);
      const configs: Array<[string, number]> = [];
      for (const p of w === WORKERS[0] ? POLICIES : POLICIES.filter((x) => BIG_POLICIES.includes(x)))
        for (const n of w !== WORKERS[0]
          ? OTHER_REPLICAS
          : p === "kv-aware"
            ? KV_REPLICAS
            : p === "approx-prefix"
              ? APPROX_REPLICAS
              : OTHER_REPLICAS)
          configs.push([p, n]);
      for (const [policy, replicas] of configs) {
        await resetCaches(engines.engines);
        const rs = await startReplicas(policy, replicas, {
          workersFile,
          workers: w,
          dir,
          readyTimeoutMs: READY_TIMEOUT_MS,
          speed: speedFor(w),
          share: SHARE,
        });
        const run: RunRecord = {
          workers: w,
          policy,
          replicas,
          steps: [],
          decisions: "",
          perWorkerRequests: [],
          preemptions: 0,
        };
        const before = await engineCounters(engines.engines);
        try {
          // The kv-aware servers' replay ends in the reset's AllBlocksCleared: their index starts empty too.
          await new Promise((r) => setTimeout(r, 500));
          const stages = stepTraces.get(w) ?? [];
          const label = `${w}w ${policy}×${replicas}`;
          log(
            `${label}: ${stages.map((x, i) => `${x.reqs.length} at ${x.rate}/s${i === 0 ? " (warm-up)" : ""}`).join(", ")}`,
          );
          const [warm, ...steps] = await runStages(rs.url, stages, engines, rs.pids, label, speedFor(w));
          run.warmup = warm;
          run.steps = steps;
          log(stepLine(`${label} warm-up`, warm));
          for (const f of run.steps) log(stepLine(label, f));
          run.decisions = await decisionsOf(rs.servers);
          const after = await engineCounters(engines.engines);
          run.perWorkerRequests = after.map((c, i) => c.requests - before[i].requests);
          run.preemptions = after.reduce((a, c, i) => a + c.preemptions - before[i].preemptions, 0);
          log(
            `${label}: per-worker requests ${run.perWorkerRequests.join(",")}, preemptions ${run.preemptions}`,
          );
        } finally {
          await rs.close();
        }
        runs.push(run);
        writeJson(runs, hot, null);
      }
      if (w === WORKERS[0]) {
        // The hot-spot case: tenant 0 has half of the traffic.
        const reqs = buildStep(prefixes, {
          seed: SEED + 1,
          rate: HOT_RATE * SPEED,
          durationS: STEP_S / SPEED,
          questionWords: QUESTION,
          maxTokens: MAX_TOKENS,
          dominantShare: 0.5,
        });
        const hotTracker = new ReuseTracker(tok, BS);
        const hotWarm = warmStage(hotTracker, SPEED);
        const reuse = hotTracker.add(reqs);
        for (const policy of POLICIES.filter((p) => HOT_POLICIES.includes(p))) {
          await resetCaches(engines.engines);
          const rs = await startReplicas(policy, 1, {
            workersFile,
            workers: w,
            dir,
            readyTimeoutMs: READY_TIMEOUT_MS,
            speed: SPEED,
          });
          try {
            await new Promise((r) => setTimeout(r, 500));
            const label = `${w}w hot-spot ${policy}`;
            // Warm-up first (each tenant placed once), then the counters, then the hot stage.
            await runStages(rs.url, [hotWarm], engines, rs.pids, `${label} warm-up`, SPEED);
            const c0 = await engineCounters(engines.engines);
            const [f] = await runStages(
              rs.url,
              [{ rate: HOT_RATE, reqs, reuse, durationMs: (STEP_S / SPEED) * 1000 }],
              engines,
              rs.pids,
              label,
              SPEED,
            );
            const c1 = await engineCounters(engines.engines);
            const perWorker = c1.map((c, i) => ({
              requests: c.requests - c0[i].requests,
              prefillTokens: c.prefillTokens - c0[i].prefillTokens,
            }));
            const ratio = (xs: number[]) =>
              Math.max(...xs) / (xs.reduce((a, b) => a + b, 0) / xs.length || 1);
            const h: HotRecord = {
              policy,
              rate: HOT_RATE,
              dominantShare: 0.5,
              perWorker,
              maxOverMeanRequests: ratio(perWorker.map((p) => p.requests)),
              maxOverMeanPrefill: ratio(perWorker.map((p) => p.prefillTokens)),
              step: f,
            };
            hot.push(h);
            log(
              `${stepLine(label, f)}; per-worker requests ${perWorker.map((p) => p.requests).join(",")} (max/mean ${h.maxOverMeanRequests.toFixed(2)}), prefill max/mean ${h.maxOverMeanPrefill.toFixed(2)}`,
            );
          } finally {
            await rs.close();
          }
        }
      }
      await engines.close();
      engines = null;
    }
  } finally {
    await engines?.close();
    rmSync(dir, { recursive: true, force: true });
  }
  const g = goals(runs, hot, SLO, WORKERS[0]);
  printSteps(runs, hot, WORKERS.map(speedFor).join(", "));
  printHeadline(runs);
  printGoals(g);
  writeJson(runs, hot, g);
  writeFileSync(join(OUT, quick ? "plot-quick.html" : "plot.html"), renderHtml(runs, SLO, settings()));
  console.log(
    `\nwrote ${join(OUT, quick ? "results-quick.json" : "results.json")} and ${join(OUT, quick ? "plot-quick.html" : "plot.html")}; total wall time ${((Date.now() - t0) / 1000).toFixed(0)} s`,
  );
}

function settings(): Record<string, unknown> {
  return {
    quick,
    tenants: TENANTS,
    prefixWords: PREFIX,
    questionWords: QUESTION,
    maxTokens: MAX_TOKENS,
    blockSize: BS,
    blocksPerEngine: Object.fromEntries(WORKERS.map((w) => [w, blocksPerEngine(w)])),
    rates8: RATES,
    bigRates8: BIG_RATES,
    stepModelS: STEP_S,
    drainWallS: DRAIN_S,
    speed: Object.fromEntries(WORKERS.map((w) => [w, speedFor(w)])),
    profile: PROFILE.replace(HERE, "bench/fleet-routing/"),
    slo: SLO,
    seed: SEED,
    hotRate: HOT_RATE,
    cpus: NCPU,
  };
}

function writeJson(runs: RunRecord[], hot: HotRecord[], g: Goal[] | null): void {
  writeFileSync(
    join(OUT, quick ? "results-quick.json" : "results.json"),
    `${JSON.stringify({ created_at: new Date().toISOString(), settings: settings(), runs, hotSpot: hot, goals: g }, null, 1)}\n`,
  );
}

if (has("trace")) await (await import("./trace-run.ts")).traceMain(args);
else await main();
