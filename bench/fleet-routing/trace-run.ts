/**
 * `bench/fleet-routing/run.ts --trace FILE`: replays a recorded or generated trace through
 * `infera server` replicas over one `infera-sim --fleet N`, per policy and replica count
 * (issue #28 item 5). FILE is JSONL in either shape src/loadgen/workloads/trace.ts reads: Mooncake's
 * `{timestamp, input_length, output_length, hash_ids}` (each id one 512-token block of text, the
 * same id the same text) or OpenAI request bodies with `messages`/`prompt` and a timestamp.
 *
 * The report: the trace's ideal reuse and what a fleet-wide LRU of the fleet's total KV reaches
 * (./trace-stats.ts), each policy's prefix hit rate (cached / prompt tokens of the finished
 * requests, from the engines' usage) and its fraction of both, TTFT p50/p90/p99, goodput and the
 * engines' preemptions. `--load L` replays the trace at L × the fleet's prefill capacity
 * (./trace-stats.ts timeScaleForLoad); `--time-scale F` sets the speed-up directly.
 */
import { readFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { runBench } from "../../src/loadgen/index.ts";
import type { BenchRequest } from "../../src/loadgen/types.ts";
import { traceWorkload } from "../../src/loadgen/workloads/trace.ts";
import type { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { cpuSeconds, type Engines, engineCounters, resetCaches } from "./engines.ts";
import { decisionsOf, MODEL, startReplicas } from "./servers.ts";
import { type Slo, type StepFigures, stepFigures } from "./stats.ts";
import { loadAt, type PrefillModel, type TraceStats, timeScaleForLoad, traceStats } from "./trace-stats.ts";

/**
 * A trace's requests, each as chat messages (a bare prompt becomes one user message), with
 * max_tokens capped at `maxOutput` when given: the prompts (histories included) stay the
 * trace's, only the decode is shortened (a box that cannot stream every answer in time).
 */
export function traceRequests(
  lines: string[],
  o: { limit?: number; maxOutput?: number } = {},
): BenchRequest[] {
  const cap = o.maxOutput ?? Number.POSITIVE_INFINITY;
  return traceWorkload({ kind: "trace", lines }, Math.min(o.limit ?? lines.length, lines.length)).map(
    (r) => ({
      ...r,
      messages: r.messages ?? [{ role: "user", content: r.prompt ?? "" }],
      prompt: undefined,
      maxTokens: Math.min(r.maxTokens, cap),
    }),
  );
}

export function loadTrace(path: string, o: { limit?: number; maxOutput?: number } = {}): BenchRequest[] {
  return traceRequests(readFileSync(path, "utf8").split("\n"), o);
}

export interface TraceCase {
  /** Name in the tables (e.g. the file name, or "multi-turn at 0.7×"). */
  name: string;
  reqs: BenchRequest[];
  stats: TraceStats;
  workers: number;
  /** Offered load (× the fleet's prefill capacity) and the time scale that gives it. */
  load: number;
  timeScale: number;
}

/** Stats and the time scale of a trace for `workers` engines of `blocksPerEngine` blocks. */
export function prepareCase(
  name: string,
  reqs: BenchRequest[],
  o: {
    tok: Tokenizer;
    blockSize: number;
    workers: number;
    blocksPerEngine: number;
    model: PrefillModel;
    load?: number;
    timeScale?: number;
    stats?: TraceStats;
  },
): TraceCase {
  const stats =
    o.stats ??
    traceStats(reqs, {
      tok: o.tok,
      blockSize: o.blockSize,
      fleetBlocks: o.blocksPerEngine * o.workers,
      model: o.model,
    });
  const timeScale = o.load !== undefined ? timeScaleForLoad(stats, o.workers, o.load) : (o.timeScale ?? 1);
  return { name, reqs, stats, workers: o.workers, load: loadAt(stats, o.workers, timeScale), timeScale };
}

export function describeCase(c: TraceCase): string {
  const s = c.stats;
  const pct = (x: number) => `${((100 * x) / Math.max(1, s.promptTokens)).toFixed(1)}%`;
  return `${c.name}: ${s.requests} requests, mean prompt ${(s.promptTokens / Math.max(1, s.requests)).toFixed(0)} tokens, span ${s.spanS.toFixed(0)} model s at scale 1; ideal reuse ${pct(s.ideal.reachable)}, fleet-wide LRU (${s.fleetBlocks} blocks, footprint ${s.distinctBlocks}) ${pct(s.lru.reachable)}; prefill work ${s.prefillWorkS.toFixed(0)} worker-s at the ideal reuse → load ${c.load.toFixed(2)}× of ${c.workers} workers' prefill capacity at time scale ${c.timeScale.toFixed(3)} (replays in ${(s.spanS / c.timeScale).toFixed(0)} model s)`;
}

export interface TraceRun {
  case: string;
  load: number;
  timeScale: number;
  policy: string;
  replicas: number;
  fig: StepFigures;
  /** The same finished requests' fleet-wide-LRU reachable rate, and the hit rate's fraction of it. */
  lruRate: number;
  ofLru: number;
  preemptions: number;
  perWorkerRequests: number[];
  decisions: string;
  /** Failed requests by kind (cancelled = given up at the drain limit). */
  errorsByKind: Record<string, number>;
}

export interface RunContext {
  engines: Engines;
  workersFile: string;
  dir: string;
  speed: number;
  slo: Slo;
  seed: number;
  /** Wall seconds the run waits for its backlog after the last arrival, at least. */
  drainS: number;
  readyTimeoutMs: number;
  log: (s: string) => void;
}

/** One policy × replica count over one trace case: reset caches, fresh replicas, replay, figures. */
export async function runTraceOnce(
  ctx: RunContext,
  c: TraceCase,
  policy: string,
  replicas: number,
): Promise<TraceRun> {
  const { engines, speed } = ctx;
  await resetCaches(engines.engines);
  const rs = await startReplicas(policy, replicas, {
    workersFile: ctx.workersFile,
    workers: engines.engines.length,
    dir: ctx.dir,
    readyTimeoutMs: ctx.readyTimeoutMs,
    speed,
  });
  const label = `${c.name} ${policy}×${replicas}`;
  try {
    // The kv-aware servers' replay ends in the reset's AllBlocksCleared: their index starts empty too.
    await new Promise((r) => setTimeout(r, 500));
    const before = await engineCounters(engines.engines);
    const wallScale = c.timeScale * speed;
    const lastMs = Math.max(0, ...c.reqs.map((r) => r.arrivalMs ?? 0)) / wallScale;
    // An overloaded replay ends with a backlog of about (load − 1) × its length of work, more
    // for a policy that hits less than the ideal; up to load × its length is waited for.
    const drainMs = ctx.drainS * 1000 + lastMs * Math.max(0.5, c.load);
    const ac = new AbortController();
    let abortMs = Number.POSITIVE_INFINITY;
    const started = performance.now();
    const timer = setTimeout(() => {
      abortMs = performance.now() - started;
      ac.abort();
    }, lastMs + drainMs);
    const cpu0 = cpuSeconds(engines.pids[0]);
    const srv0 = rs.pids.reduce((a, p) => a + cpuSeconds(p), 0);
    let lastLog = 0;
    const result = await runBench({
      url: rs.url,
      model: MODEL,
      workload: c.reqs,
      timeScale: wallScale,
      stream: true,
      seed: ctx.seed,
      timeoutMs: lastMs + drainMs + 60_000,
      label,
      signal: ac.signal,
      onProgress: (p) => {
        if (p.elapsedMs - lastLog < 10_000) return;
        lastLog = p.elapsedMs;
        ctx.log(
          `  ${label}: ${p.done}/${p.total} done, ${p.inFlight} in flight, ${(p.elapsedMs / 1000).toFixed(0)} of ~${((lastMs + drainMs) / 1000).toFixed(0)} s at most, load ${loadavg()[0].toFixed(1)}`,
        );
      },
    });
    clearTimeout(timer);
    const wallS = (performance.now() - started) / 1000;
    const fig = stepFigures(c.load, result.requests, c.reqs.length, c.stats.ideal, {
      speed,
      slo: ctx.slo,
      abortMs,
      wallS,
      cpu: {
        fleetCore: (100 * (cpuSeconds(engines.pids[0]) - cpu0)) / wallS,
        fleetBox: (100 * (cpuSeconds(engines.pids[0]) - cpu0)) / wallS / cpus().length,
        serversCore: (100 * (rs.pids.reduce((a, p) => a + cpuSeconds(p), 0) - srv0)) / wallS,
        benchCore: 0,
        load1: loadavg()[0],
      },
    });
    let lru = 0;
    for (const r of result.requests) {
      const pr = c.stats.lru.perRequest[r.index];
      if (r.ok && pr) lru += (pr.reachable / pr.prompt) * (r.prompt_tokens ?? pr.prompt);
    }
    const lruRate = fig.promptTokens > 0 ? lru / fig.promptTokens : 0;
    const after = await engineCounters(engines.engines);
    const run: TraceRun = {
      case: c.name,
      load: c.load,
      timeScale: c.timeScale,
      policy,
      replicas,
      fig,
      lruRate,
      ofLru: lruRate > 0 ? fig.hitRate / lruRate : 0,
      preemptions: after.reduce((a, x, i) => a + x.preemptions - before[i].preemptions, 0),
      perWorkerRequests: after.map((x, i) => x.requests - before[i].requests),
      decisions: await decisionsOf(rs.servers),
      errorsByKind: result.summary.errors_by_kind,
    };
    ctx.log(runLine(run));
    return run;
  } finally {
    await rs.close();
  }
}

const pc = (x: number) => `${(100 * x).toFixed(1)}%`;
const sec = (ms: number) => (Number.isFinite(ms) ? (ms / 1000).toFixed(2) : "∞");

export function runLine(r: TraceRun): string {
  const f = r.fig;
  return `${r.case} ${r.policy}×${r.replicas}: hit ${pc(f.hitRate)} (${pc(f.ofReachable)} of ideal, ${pc(r.ofLru)} of fleet LRU), TTFT p50/p90/p99 ${sec(f.ttftP50)}/${sec(f.ttftP90)}/${sec(f.ttftP99)} s, goodput ${f.goodput.toFixed(2)}/s, ${f.ok}/${f.requests} done (${f.unfinished} unfinished, ${f.errors} errors ${JSON.stringify(r.errorsByKind)}), preemptions ${r.preemptions}, ${f.wallS.toFixed(0)} s wall, load ${f.cpu.load1.toFixed(1)}`;
}

/** One table per case: each policy's hit rate against the trace's ideal and fleet-LRU figures. */
export function printTraceTable(c: TraceCase, runs: readonly TraceRun[]): void {
  const s = c.stats;
  const ideal = s.ideal.reachable / Math.max(1, s.promptTokens);
  const lru = s.lru.reachable / Math.max(1, s.promptTokens);
  console.log(
    `\n### ${c.name}: load ${c.load.toFixed(2)}× capacity, ${c.workers} workers; ideal reuse ${pc(ideal)}, fleet-wide LRU ${pc(lru)} (whole trace)\n`,
  );
  console.log(
    "| policy × replicas | prefix hit (finished) | % of ideal | % of fleet LRU | TTFT p50 s | p90 s | p99 s | goodput/s | done | preemptions |\n|---|---|---|---|---|---|---|---|---|---|",
  );
  for (const r of runs) {
    const f = r.fig;
    // Unfinished requests count with the time they had waited: the percentiles are lower bounds.
    const ge = f.unfinished > 0 ? "≥ " : "";
    console.log(
      `| ${r.policy} × ${r.replicas} | ${pc(f.hitRate)} | ${pc(f.ofReachable)} | ${pc(r.ofLru)} | ${ge}${sec(f.ttftP50)} | ${ge}${sec(f.ttftP90)} | ${ge}${sec(f.ttftP99)} | ${f.goodput.toFixed(2)} | ${f.ok}/${f.requests} | ${r.preemptions} |`,
    );
  }
}

/** Blocks per engine: the profile's pool, or `kvFraction` × the trace's footprint over the fleet. */
export function blocksFor(
  reqs: readonly BenchRequest[],
  o: { tok: Tokenizer; blockSize: number; workers: number; profileBlocks: number; kvFraction?: number },
): number {
  if (o.kvFraction === undefined) return o.profileBlocks;
  const footprint = traceStats(reqs, {
    tok: o.tok,
    blockSize: o.blockSize,
    fleetBlocks: 0,
    model: { prefill_per_token_s: 0, attention_per_token_ctx_s: 0 },
  }).distinctBlocks;
  return Math.ceil((o.kvFraction * footprint) / o.workers);
}

/**
 * `run.ts --trace FILE[,FILE…] [--workers 8] [--policies round-robin,approx-prefix,kv-aware]
 * [--replicas 1,4] [--load 0.7 | --time-scale F] [--speed 0.25] [--kv-blocks N | --kv-fraction X]
 * [--limit N] [--max-output N] [--drain-s 30] [--out DIR] [--dry]`: every policy at every replica count, per trace.
 */
export async function traceMain(args: readonly string[]): Promise<void> {
  const { mkdtempSync, rmSync, writeFileSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { basename, join } = await import("node:path");
  const { fileURLToPath } = await import("node:url");
  const { getDefaultTokenizer } = await import("../../src/tokenizer/tokenizer.ts");
  const { handleFatalSignals } = await import("../../src/util/child-process.ts");
  const { startEngines } = await import("./engines.ts");
  const { writeWorkersFile } = await import("./servers.ts");
  handleFatalSignals();
  const str = (name: string, def: string) => {
    const i = args.indexOf(`--${name}`);
    return i >= 0 ? args[i + 1] : def;
  };
  const list = (name: string, def: string) => str(name, def).split(",").filter(Boolean);
  const here = fileURLToPath(new URL(".", import.meta.url));
  const profilePath = str("profile", join(here, "qwen3-32b-tp2-h100.json"));
  const profile = JSON.parse(readFileSync(profilePath, "utf8")) as PrefillModel & { num_gpu_blocks: number };
  const workers = Number(str("workers", "8"));
  const bs = Number(str("block-size", "16"));
  const speed = Number(str("speed", "0.25"));
  const tok = getDefaultTokenizer();
  const log = (s: string) =>
    process.stderr.write(`[fleet-routing --trace ${new Date().toISOString().slice(11, 19)}] ${s}\n`);
  const files = list("trace", "");
  const maxOutput = str("max-output", "");
  const traces = files.map((f) => ({
    name: basename(f),
    reqs: loadTrace(f, {
      limit: Number(str("limit", "Infinity")),
      maxOutput: maxOutput === "" ? undefined : Number(maxOutput),
    }),
  }));
  const kvFraction = str("kv-fraction", "");
  const blocks = Number(
    str(
      "kv-blocks",
      String(
        blocksFor(traces[0]?.reqs ?? [], {
          tok,
          blockSize: bs,
          workers,
          profileBlocks: profile.num_gpu_blocks,
          kvFraction: kvFraction === "" ? undefined : Number(kvFraction),
        }),
      ),
    ),
  );
  const load = str("load", "");
  const cases = traces.map((t) =>
    prepareCase(t.name, t.reqs, {
      tok,
      blockSize: bs,
      workers,
      blocksPerEngine: blocks,
      model: profile,
      load: load === "" ? undefined : Number(load),
      timeScale: Number(str("time-scale", "1")),
    }),
  );
  for (const c of cases) log(describeCase(c));
  if (args.includes("--dry")) return;
  const dir = mkdtempSync(join(tmpdir(), "fleet-routing-trace-"));
  const engines = await startEngines(workers, [
    ...["--block-size", String(bs), "--num-gpu-blocks", String(blocks)],
    ...["--speed", String(speed), "--profile", profilePath],
  ]);
  const runs: TraceRun[] = [];
  try {
    log(
      `${workers} engines (${engines.mode}) × ${blocks} blocks of ${bs}, --speed ${speed}; ${cpus().length} CPUs, load ${loadavg()[0].toFixed(1)}`,
    );
    const ctx: RunContext = {
      engines,
      workersFile: writeWorkersFile(dir, engines.engines, bs),
      dir,
      speed,
      slo: { ttftMs: Number(str("slo-ttft-ms", "2000")), itlMs: Number(str("slo-itl-ms", "50")) },
      seed: Number(str("seed", "1")),
      drainS: Number(str("drain-s", "30")),
      readyTimeoutMs: 90_000,
      log,
    };
    for (const c of cases)
      for (const policy of list("policies", "round-robin,approx-prefix,kv-aware"))
        for (const n of list("replicas", "1").map(Number)) runs.push(await runTraceOnce(ctx, c, policy, n));
  } finally {
    await engines.close();
    rmSync(dir, { recursive: true, force: true });
  }
  for (const c of cases) {
    console.log(describeCase(c));
    printTraceTable(
      c,
      runs.filter((r) => r.case === c.name),
    );
  }
  const out = join(str("out", here), "trace-results.json");
  writeFileSync(
    out,
    `${JSON.stringify({ created_at: new Date().toISOString(), args, blocksPerEngine: blocks, speed, cases: cases.map((c) => ({ name: c.name, load: c.load, timeScale: c.timeScale, stats: statsSummary(c.stats) })), runs }, null, 1)}\n`,
  );
  console.log(`\nwrote ${out}`);
}

/** The stats without their per-request arrays, for the JSON results. */
export function statsSummary(s: TraceStats): Record<string, number> {
  return {
    requests: s.requests,
    promptTokens: s.promptTokens,
    idealReuse: s.ideal.reachable / Math.max(1, s.promptTokens),
    fleetLruReuse: s.lru.reachable / Math.max(1, s.promptTokens),
    fleetBlocks: s.fleetBlocks,
    distinctBlocks: s.distinctBlocks,
    spanS: s.spanS,
    prefillWorkS: s.prefillWorkS,
  };
}
