/**
 * KV-aware routing benchmark: the same seeded trace (multi-turn conversations sharing system
 * prompts + document QA over long documents) through `infera server` under round-robin,
 * approx-prefix and kv-aware, against 8 simulated engines whose block pools are small enough
 * to force eviction. One run, side by side.
 *
 *   node bench/kv-routing/run.ts [--speed 0.5] [--blocks 320] [--replicas 2] [--quick]
 *     [--policies round-robin,kv-aware] [--policy-option recentRoutingMs=3000 ...]
 *     [--baseline <checkout>] [--ready-timeout 60]
 *
 * `--baseline` runs each policy a second time with the servers spawned from another checkout's
 * bin/infera.js (e.g. a `git worktree` of the previous commit with a node_modules symlink): same
 * trace, same sims (caches reset before each run), the two sides one after the other per policy
 * (order alternating between policies), and prints them side by side.
 *
 * Goals (issue 5): kv-aware TTFT p50 ≤ 0.5× round-robin; hit rate ≥ 95% of the trace's
 * reachable reuse; better than approx-prefix.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { runBench } from "../../src/loadgen/index.ts";
import type { BenchResult } from "../../src/loadgen/schema.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { handleFatalSignals, killOnExit, stopChild } from "../../src/util/child-process.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { type SimProcess, startSim } from "../../test/helpers/sim.ts";
import { exitWithUsageIfAsked } from "../usage.ts";
import { startBalancer } from "./balancer.ts";
import { buildTrace, defaultTrace, reachableReuse } from "./trace.ts";

const args = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, args);
const flag = (name: string, def: number) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : def;
};
const quick = args.includes("--quick");
const WORKERS = flag("workers", 8);
const BLOCKS = flag("blocks", 320);
/** Server replicas behind a round-robin balancer (each learns only part of the traffic). */
const REPLICAS = flag("replicas", 2);
// 0.5: simulated compute twice as slow as the default profile (a larger model), so that it, not
// this shared 2-core machine's CPU overheads, dominates TTFT.
const SPEED = flag("speed", 0.5);
const BS = 16;
const MODEL = "sim-model";
const ALL_POLICIES = ["round-robin", "approx-prefix", "kv-aware"];
const pi = args.indexOf("--policies");
const POLICIES = pi >= 0 ? args[pi + 1].split(",") : ALL_POLICIES;
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const bi = args.indexOf("--baseline");
const BASELINE = bi >= 0 ? resolve(args[bi + 1]) : undefined;
if (BASELINE && !existsSync(join(BASELINE, "bin/infera.js")))
  throw new Error(`--baseline ${BASELINE}: no bin/infera.js there`);
/** Seconds a server may take to see all workers: start-up through tsx on a busy box is slow. */
const READY_TIMEOUT_MS = flag("ready-timeout", 60) * 1000;
/** The checkouts the servers run from: this one ("new") and, with --baseline, the other. */
const SIDES: { side: string; root: string }[] = [
  { side: "new", root: ROOT },
  ...(BASELINE ? [{ side: "base", root: BASELINE }] : []),
];

const traceOpts = quick
  ? { ...defaultTrace, conversations: 16, questions: 40, windowS: 8 }
  : { ...defaultTrace, windowS: flag("window", defaultTrace.windowS) };
const trace = buildTrace(traceOpts);
const reuse = reachableReuse(trace, getDefaultTokenizer(), BS);

async function startServer(
  policy: string,
  workersFile: string,
  root: string,
): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  const child = spawn(
    process.execPath,
    [
      join(root, "bin/infera.js"),
      ...serverArgs(port),
      "--discovery",
      "static",
      "--workers-file",
      workersFile,
      "--policy",
      policy,
      "--scrape-interval",
      "250",
      // --policy-option key=value given to this script passes through to the servers.
      ...args.flatMap((a, i) => (args[i - 1] === "--policy-option" ? ["--policy-option", a] : [])),
    ],
    {
      cwd: root,
      env: { ...process.env, INFERA_LOG_LEVEL: process.env.KV_ROUTING_SERVER_LOG ?? "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  killOnExit(child);
  let out = "";
  if (process.env.KV_ROUTING_SERVER_LOG) child.stdout?.on("data", (b) => process.stderr.write(b));
  child.stdout?.on("data", (b) => (out += b));
  child.stderr?.on("data", (b) => (out += b));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`infera server exited: ${out}`);
    try {
      const r = await fetch(`${url}/ready`);
      if (r.ok) {
        const j = (await r.json()) as { workers: number };
        if (j.workers === WORKERS) break;
      }
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) throw new Error(`infera server not ready: ${out}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url, child };
}

async function resetCaches(sims: SimProcess[]): Promise<void> {
  for (const s of sims) {
    for (let i = 0; ; i++) {
      const r = await fetch(`${s.url}/reset_prefix_cache`, { method: "POST" });
      if (r.ok) break;
      if (i > 50) throw new Error(`reset_prefix_cache on ${s.url}: ${r.status}`);
      await new Promise((res) => setTimeout(res, 100));
    }
  }
}

interface Row {
  policy: string;
  /** Which checkout's server ran: "new" (this one) or "base" (--baseline). */
  side: string;
  /** Hit rate of the conversation and document requests separately. */
  convHit: number;
  docHit: number;
  decisions: string;
  hitRate: number;
  ofReachable: number;
  ttftP50: number;
  ttftP90: number;
  ttftP99: number;
  reqPerS: number;
  outTokPerS: number;
  errors: number;
  seconds: number;
}

function groupHit(r: BenchResult, prefix: string): number {
  let cached = 0;
  let prompt = 0;
  for (const q of r.requests)
    if (q.ok && q.group?.startsWith(prefix)) {
      cached += q.cached_tokens ?? 0;
      prompt += q.prompt_tokens ?? 0;
    }
  return prompt > 0 ? cached / prompt : 0;
}

/** The server's routing decisions by reason, from its /metrics. */
async function decisionsOf(url: string): Promise<string> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out: string[] = [];
  for (const m of text.matchAll(/^infera_routing_decisions_total\{([^}]*)\} (\d+)/gm)) {
    const reason = /reason="([^"]*)"/.exec(m[1])?.[1];
    if (reason) out.push(`${reason}=${m[2]}`);
  }
  // KV ingestion health (kv-aware only): replays, resets, malformed messages.
  for (const m of text.matchAll(
    /^infera_kv_(replays|worker_resets|malformed_messages)_total(\{[^}]*\})? (\d+)/gm,
  ))
    if (m[3] !== "0") out.push(`${m[1]}${m[2] ?? ""}=${m[3]}`);
  return out.join(" ");
}

function rowOf(policy: string, side: string, r: BenchResult, decisions: string): Row {
  const s = r.summary;
  const hit = s.prefix_cache_hit_rate ?? 0;
  const reachableRate = reuse.reachable / reuse.prompt;
  return {
    policy,
    side,
    convHit: groupHit(r, "conv"),
    docHit: groupHit(r, "doc"),
    decisions,
    hitRate: hit,
    ofReachable: hit / reachableRate,
    ttftP50: s.latency_ms.ttft.p50 ?? Number.NaN,
    ttftP90: s.latency_ms.ttft.p90 ?? Number.NaN,
    ttftP99: s.latency_ms.ttft.p99 ?? Number.NaN,
    reqPerS: s.throughput.requests_per_s,
    outTokPerS: s.throughput.output_tokens_per_s,
    errors: s.requests.errors + s.requests.not_sent,
    seconds: s.duration_s,
  };
}

const f1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "n/a");
const pct = (x: number) => `${(100 * x).toFixed(1)}%`;

/** Per policy, this checkout vs the baseline: `new / base` in each cell (a Markdown table). */
function printSideBySide(rows: Row[]): void {
  console.log(`\nside by side, new / base (${BASELINE}):`);
  console.log("| policy | hit rate | of reachable | conv / doc hit | TTFT p50 ms | TTFT p90 ms | errors |");
  console.log("|---|---|---|---|---|---|---|");
  for (const policy of POLICIES) {
    const n = rows.find((r) => r.policy === policy && r.side === "new");
    const b = rows.find((r) => r.policy === policy && r.side === "base");
    if (!n || !b) continue;
    const both = (f: (r: Row) => string) => `${f(n)} / ${f(b)}`;
    console.log(
      `| ${policy} | ${both((r) => pct(r.hitRate))} | ${both((r) => pct(r.ofReachable))} | ${both((r) => `${pct(r.convHit)}, ${pct(r.docHit)}`)} | ${both((r) => f1(r.ttftP50))} | ${both((r) => f1(r.ttftP90))} | ${both((r) => String(r.errors))} |`,
    );
  }
  for (const policy of POLICIES)
    for (const r of rows.filter((x) => x.policy === policy))
      console.log(`decisions ${policy} (${r.side}): ${r.decisions}`);
}

async function main(): Promise<void> {
  // Interrupted: stop the sims and the server replicas (killOnExit, at spawn) before exiting.
  handleFatalSignals();
  const t0 = Date.now();
  console.log(
    `kv-routing benchmark: ${trace.length} requests (${traceOpts.conversations} conversations × ${traceOpts.turns} turns over ${traceOpts.systemPrompts} system prompts, ${traceOpts.questions} questions over ${traceOpts.documents} documents of ~${traceOpts.documentWords} tokens), ${WORKERS} sims × ${BLOCKS} blocks of ${BS} tokens, --speed ${SPEED}, ${REPLICAS} server replicas behind a round-robin balancer`,
  );
  console.log(
    `load average at the start: ${loadavg()
      .map((x) => x.toFixed(1))
      .join(" ")}${BASELINE ? `; baseline servers from ${BASELINE}` : ""}`,
  );
  const g = reuse.byGroup;
  console.log(
    `trace: ${reuse.prompt} prompt tokens, reachable reuse ${reuse.reachable} tokens = ${pct(reuse.reachable / reuse.prompt)} (conversations ${pct(g.conv.reachable / g.conv.prompt)}, documents ${pct(g.doc.reachable / g.doc.prompt)})`,
  );
  // freePort() can race with other processes on a shared machine: retry a sim that lost its port.
  const startOne = async (): Promise<SimProcess> => {
    for (let attempt = 0; ; attempt++) {
      try {
        return await startSim({
          args: ["--block-size", String(BS), "--num-gpu-blocks", String(BLOCKS), "--speed", String(SPEED)],
          timeoutMs: 90_000,
        });
      } catch (err) {
        if (attempt >= 2 || !String(err).includes("EADDRINUSE")) throw err;
      }
    }
  };
  const started = await Promise.allSettled(Array.from({ length: WORKERS }, startOne));
  const sims = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  if (sims.length < WORKERS) {
    await Promise.all(sims.map((s) => s.stop()));
    throw (started.find((s) => s.status === "rejected") as PromiseRejectedResult).reason;
  }
  const dir = mkdtempSync(join(tmpdir(), "kv-routing-"));
  const workersFile = join(dir, "workers.json");
  writeFileSync(
    workersFile,
    JSON.stringify(
      sims.map((s, i) => ({
        id: `sim-${i}`,
        url: s.url,
        model: MODEL,
        servedModelNames: [MODEL],
        engine: "sim",
        blockSize: BS,
        kvEvents: {
          endpoint: s.kvEndpoint,
          replayEndpoint: s.replayEndpoint,
          topic: "kv-events",
          framing: "seq",
        },
      })),
    ),
  );
  const rows: Row[] = [];
  try {
    for (const [n, policy] of POLICIES.entries()) {
      // Alternate which side goes first, so drift in the machine's load hits both alike.
      for (const { side, root } of n % 2 === 0 ? SIDES : [...SIDES].reverse()) {
        await resetCaches(sims);
        const servers = await Promise.all(
          Array.from({ length: REPLICAS }, () => startServer(policy, workersFile, root)),
        );
        const lb = await startBalancer(servers.map((s) => s.url));
        try {
          // Let the kv-aware server's subscribers join and replay (the replay ends in the reset's
          // AllBlocksCleared, so its index starts empty like the caches).
          await new Promise((r) => setTimeout(r, 500));
          const result = await runBench({
            url: lb.url,
            model: MODEL,
            workload: trace,
            stream: true,
            seed: traceOpts.seed,
            timeoutMs: 60_000,
            label: `${policy} (${side})`,
          });
          const decisions = (await Promise.all(servers.map((s) => decisionsOf(s.url)))).join(" | ");
          rows.push(rowOf(policy, side, result, decisions));
          const r = rows[rows.length - 1];
          console.log(
            `  ${policy.padEnd(13)}${BASELINE ? ` ${side.padEnd(4)}` : ""} done in ${f1(r.seconds)} s: hit ${pct(r.hitRate)} (conversations ${pct(r.convHit)}, documents ${pct(r.docHit)}), TTFT p50 ${f1(r.ttftP50)} ms; decisions ${r.decisions}`,
          );
        } finally {
          await lb.close();
          await Promise.all(servers.map((s) => stopChild(s.child)));
        }
      }
    }
  } finally {
    await Promise.all(sims.map((s) => s.stop()));
    rmSync(dir, { recursive: true, force: true });
  }

  const header = [
    "policy",
    ...(BASELINE ? ["side"] : []),
    "hit rate",
    "of reachable",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "TTFT p99 ms",
    "req/s",
    "out tok/s",
    "errors",
  ];
  const lines = rows.map((r) => [
    r.policy,
    ...(BASELINE ? [r.side] : []),
    pct(r.hitRate),
    pct(r.ofReachable),
    f1(r.ttftP50),
    f1(r.ttftP90),
    f1(r.ttftP99),
    r.reqPerS.toFixed(2),
    r.outTokPerS.toFixed(0),
    String(r.errors),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)));
  const fmtRow = (l: string[]) => l.map((c, i) => c.padEnd(widths[i])).join("  ");
  console.log(`\n${fmtRow(header)}\n${widths.map((w) => "-".repeat(w)).join("  ")}`);
  for (const l of lines) console.log(fmtRow(l));
  if (BASELINE) printSideBySide(rows);
  console.log(
    `load average at the end: ${loadavg()
      .map((x) => x.toFixed(1))
      .join(" ")}`,
  );
  const by = Object.fromEntries(rows.filter((r) => r.side === "new").map((r) => [r.policy, r]));
  if (ALL_POLICIES.some((p) => !by[p])) return;
  const kv = by["kv-aware"];
  const rr = by["round-robin"];
  const ap = by["approx-prefix"];
  const ratio = kv.ttftP50 / rr.ttftP50;
  console.log(
    `\nkv-aware TTFT p50 / round-robin: ${ratio.toFixed(2)}×   goal ≤ 0.5×  ${ratio <= 0.5 ? "OK" : "MISS"}`,
  );
  console.log(
    `kv-aware TTFT p50 / approx-prefix: ${(kv.ttftP50 / ap.ttftP50).toFixed(2)}×, p99: ${(kv.ttftP99 / ap.ttftP99).toFixed(2)}×`,
  );
  console.log(
    `kv-aware hit rate: ${pct(kv.ofReachable)} of reachable   goal ≥ 95%  ${kv.ofReachable >= 0.95 ? "OK" : "MISS"}`,
  );
  console.log(
    `kv-aware vs approx-prefix hit rate: ${pct(kv.hitRate)} vs ${pct(ap.hitRate)}  ${kv.hitRate > ap.hitRate ? "OK (better)" : "MISS"}`,
  );
  console.log(`total wall time ${((Date.now() - t0) / 1000).toFixed(0)} s`);
}

await main();
