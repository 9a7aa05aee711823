/**
 * What one proxied request costs on this machine in fleet-scale's shape (open loop, N workers,
 * short non-streamed completions), for nginx and infera side by side in one run:
 *
 *   node bench/fleet-scale/proxy-floor.ts [--workers 256] [--rate 1000] [--seconds 10]
 *     [--warmup-seconds 15] [--rounds 2] [--server-root DIR] [--nginx /usr/sbin/nginx]
 *     [--targets n,b,r,k] [--baseline DIR]   (with a baseline, r0 / k0: its server, same round)
 *
 * Why: issue #32 asks kv-aware routing at 256 workers for ≤ 150 µs of server CPU per request
 * (decision + proxy). bench/router-overhead measures the proxy in a closed loop (wrk, c=16),
 * where one wake-up serves several requests; at 1,000 req/s open loop each request arrives
 * alone, and its two loopback sends (to the engine, to the client) each wake a sleeping peer
 * inside the sender's write(). This bench prices that floor with nginx, the reference the issue
 * uses elsewhere, through the same fleet and load:
 *
 * - (n) nginx `proxy_pass` to an upstream of all N engines (round-robin, one worker process,
 *   keep-alive pool larger than N so no request opens a connection);
 * - (b) a bare Node.js proxy: node:http and one undici Pool per engine, round-robin, no
 *   validation, routing state or metrics: the floor for any Node gateway here;
 * - (r) `infera server --policy round-robin`: the proxy with a trivial decision (no KV events,
 *   no load scrapes);
 * - (k) `infera server --policy kv-aware`: decision + proxy + following the fleet's KV events
 *   and load. Its "following" share is measured in the same round with the load sent straight
 *   to the engines (the server then only follows) and subtracted, as run.ts does.
 *
 * Each target gets its own warm-up, then the measured phase: CPU of the proxy process (nginx's
 * worker included) over the phase ÷ answers. Rounds alternate the targets. Progress on stderr,
 * one JSON line per round and a summary on stdout.
 *
 * Caveat: what "following" costs depends on the fleet's state as well as the server (engines
 * whose pools are full send a BlockRemoved beside each BlockStored), and in A/B runs the first
 * kv-aware target of a round measured 2–3× the second's whichever build it was. Compare
 * builds by their totals (`…Us`); the decision + proxy split is an estimate.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { handleFatalSignals } from "../../src/util/child-process.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { BARE_PROXY, nginxConf } from "../reference-proxies.ts";
import { exitWithUsageIfAsked } from "../usage.ts";
import { cpuOf, cpuWindow, load, round1, scrape, sumOf } from "./measure.ts";
import {
  type Child,
  child,
  runLoad,
  type Server,
  startFleet,
  startServer,
  waitServerReady,
  workerRecords,
} from "./procs.ts";

const argv = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, argv);
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : def;
};
const N = Number(opt("workers", "256"));
const RATE = Number(opt("rate", "1000"));
const SECONDS = Number(opt("seconds", "10"));
const WARMUP = Number(opt("warmup-seconds", "15"));
const ROUNDS = Number(opt("rounds", "2"));
const SERVER_ROOT = argv.includes("--server-root") ? opt("server-root", "") : undefined;
/** `--baseline DIR`: another checkout's server, as targets r0 / k0. */
const BASELINE = argv.includes("--baseline") ? opt("baseline", "") : undefined;
/** Targets in each round's order: n nginx, b bare Node, r / k infera, r0 / k0 the baseline's. */
const TARGETS = opt("targets", BASELINE ? "n,b,r,k,r0,k0" : "n,b,r,k").split(",");
for (const t of TARGETS)
  if (!["n", "b", "r", "k", "r0", "k0"].includes(t) || (t.endsWith("0") && !BASELINE))
    throw new Error(`--targets: ${t} is not one of n, b, r, k (r0, k0 with --baseline)`);
const NGINX = opt("nginx", "/usr/sbin/nginx");
const MODEL = "sim-model";
const BS = 16;
const BLOCKS = 256;

const t0 = performance.now();
const say = (s: string) =>
  process.stderr.write(`[proxy-floor ${((performance.now() - t0) / 1000).toFixed(0).padStart(4)} s] ${s}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** CPU seconds of a process and its children (nginx's worker), from /proc. */
function treeCpu(pid: number): number {
  let kids = "";
  try {
    kids = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
  } catch {
    // gone, or no children file: its own time only
  }
  const own = cpuOf(pid)?.cpu ?? 0;
  return own + (kids ? kids.split(" ").reduce((a, k) => a + treeCpu(Number(k)), 0) : 0);
}

interface Phase {
  cpuUsPerRequest: number;
  cpuPct: number;
  okPerS: number;
  p50: number;
  p99: number;
  errors: number;
  load: string;
  /**
   * % of one core: the process, its kernel time, main thread, other threads; the machine.
   * Not for nginx (its master process idles; the worker is a child).
   */
  shares?: Record<string, number>;
}

/** Open-loop load through `urls` for `seconds`; CPU of `pid` (and its children) over it. */
async function measure(urls: readonly string[], pid: number, seconds: number, seed: number): Promise<Phase> {
  const c0 = treeCpu(pid);
  const w0 = performance.now();
  // The main thread apart from the others (an infera server's KV watcher, libzmq, GC helpers).
  const split = cpuWindow({ server: pid });
  const r = (await runLoad({ urls, rate: RATE, seconds, seed, prefixBase: 0, model: MODEL })) as {
    ok: number;
    okPerS: number;
    errors: Record<string, number>;
    latencyMs: { p50: number; p99: number };
  };
  const cpu = treeCpu(pid) - c0;
  const wall = (performance.now() - w0) / 1000;
  return {
    cpuUsPerRequest: round1((cpu / Math.max(1, r.ok)) * 1e6),
    cpuPct: round1((100 * cpu) / wall),
    okPerS: r.okPerS,
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
    errors: Object.values(r.errors).reduce((a, b) => a + b, 0),
    load: load(),
    shares: split.end(),
  };
}

async function waitUp(url: string, path: string): Promise<void> {
  for (let k = 0; k < 200; k++) {
    try {
      if ((await fetch(url + path)).status < 500) return;
    } catch {
      // not listening yet
    }
    await sleep(100);
  }
  throw new Error(`${url} not up`);
}

/** The target's result key in a round's record. */
const KEY: Record<string, string> = {
  r: "inferaRoundRobin",
  k: "inferaKvAware",
  r0: "baselineRoundRobin",
  k0: "baselineKvAware",
};

async function warm(url: string, what: string, round: number): Promise<void> {
  say(`round ${round}: ${what} warm-up ${WARMUP} s`);
  await runLoad({ urls: [url], rate: RATE, seconds: WARMUP, seed: 7, prefixBase: 0, model: MODEL });
}

/** (n) nginx in front of all engines. */
async function nginxPhase(dir: string, engines: readonly string[], round: number): Promise<Phase> {
  const port = await freePort();
  const conf = join(dir, `nginx-${round}.conf`);
  // More idle upstream connections kept than engines: none is evicted before its next turn.
  const upstreams = engines.map((u) => new URL(u).host);
  writeFileSync(
    conf,
    nginxConf({
      dir,
      port,
      upstreams,
      keepalive: Math.max(512, 4 * upstreams.length),
      workerConnections: 8192,
    }),
  );
  const ng = child(NGINX, ["-c", conf, "-p", dir]);
  try {
    const url = `http://127.0.0.1:${port}`;
    await waitUp(url, "/health");
    await warm(url, "nginx", round);
    const p = await measure([url], ng.pid, SECONDS, 100 + round);
    delete p.shares;
    say(`round ${round}: nginx ${JSON.stringify(p)}`);
    return p;
  } finally {
    await ng.stop();
  }
}

/** (b) the bare Node proxy. */
async function barePhase(dir: string, engines: readonly string[], round: number): Promise<Phase> {
  const port = await freePort();
  const file = join(dir, "bare-proxy.mjs");
  writeFileSync(file, BARE_PROXY);
  const bp = child(process.execPath, [file, String(port), "16", ...engines]);
  try {
    const url = `http://127.0.0.1:${port}`;
    await waitUp(url, "/health");
    await warm(url, "bare Node proxy", round);
    const p = await measure([url], bp.pid, SECONDS, 100 + round);
    say(`round ${round}: bare Node proxy ${JSON.stringify(p)}`);
    return p;
  } finally {
    await bp.stop();
  }
}

/**
 * (r) / (k) an infera server. kv-aware also gets its "following" phase first: the same load
 * straight to the engines, so the server only follows their KV events and load.
 */
async function inferaPhase(
  workersFile: string,
  engines: readonly string[],
  policy: "round-robin" | "kv-aware",
  root: string | undefined,
  t: string,
  round: number,
): Promise<Record<string, unknown>> {
  const s: Server = await startServer(workersFile, "warn", undefined, { policy, root });
  const key = KEY[t];
  const out: Record<string, unknown> = {};
  try {
    if (policy === "kv-aware") await waitServerReady(s, N, 120_000 + N * 200);
    else await waitUp(s.url, "/ready");
    await warm(s.url, key, round);
    const subscribed = sumOf(await scrape(s.url), "infera_kv_subscribed_workers");
    if (policy === "kv-aware") {
      out[`${key}Following`] = await measure(engines, s.pid, SECONDS, 200 + round);
      say(`round ${round}: ${key} following ${JSON.stringify(out[`${key}Following`])}`);
    }
    out[key] = { ...(await measure([s.url], s.pid, SECONDS, 100 + round)), subscribedWorkers: subscribed };
    say(`round ${round}: ${key} ${JSON.stringify(out[key])}`);
    return out;
  } finally {
    await s.stop();
  }
}

/** CPU µs per request of each target, decision + proxy of kv-aware, and ratios to nginx. */
function summary(out: Record<string, unknown>): Record<string, number> {
  const r2 = (x: number) => Math.round(x * 100) / 100;
  const res: Record<string, number> = {};
  const n = (out.nginx as Phase | undefined)?.cpuUsPerRequest;
  for (const [key, v] of Object.entries(out)) {
    if (key === "round" || key.endsWith("Following")) continue;
    const p = v as Phase;
    res[`${key}Us`] = p.cpuUsPerRequest;
    const f = out[`${key}Following`] as Phase | undefined;
    if (f) res[`${key}DecisionPlusProxyUs`] = round1(((p.cpuPct - f.cpuPct) / 100 / p.okPerS) * 1e6);
    if (n && key !== "nginx") res[`${key}OverNginx`] = r2(p.cpuUsPerRequest / n);
    if (n && f) res[`${key}DecisionPlusProxyOverNginx`] = r2(res[`${key}DecisionPlusProxyUs`] / n);
  }
  return res;
}

async function main(): Promise<void> {
  handleFatalSignals();
  const dir = mkdtempSync(join(tmpdir(), "proxy-floor-"));
  const children: Child[] = [];
  try {
    say(`${N} workers: starting the fleet (load average ${load()})`);
    const { child: fleet, manifest } = await startFleet({
      count: N,
      blockSize: BS,
      blocks: BLOCKS,
      manifest: join(dir, "manifest.json"),
      timeoutMs: 60_000 + N * 1000,
      maxRssMiB: 6000,
      model: MODEL,
    });
    children.push(fleet);
    const engines = manifest.engines.map((e) => e.url);
    const workersFile = join(dir, "workers.json");
    writeFileSync(workersFile, JSON.stringify(workerRecords(manifest, MODEL, BS, BLOCKS)));
    for (let round = 1; round <= ROUNDS; round++) {
      const out: Record<string, unknown> = { round };
      for (const t of TARGETS) {
        if (t === "n") out.nginx = await nginxPhase(dir, engines, round);
        else if (t === "b") out.bareNode = await barePhase(dir, engines, round);
        else {
          // r / k: this checkout's server; r0 / k0: the baseline's (--baseline DIR).
          const policy = t.startsWith("k") ? "kv-aware" : "round-robin";
          const root = t.endsWith("0") ? BASELINE : SERVER_ROOT;
          Object.assign(out, await inferaPhase(workersFile, engines, policy, root, t, round));
        }
      }
      out.summary = summary(out);
      say(`round ${round}: ${JSON.stringify(out.summary)}`);
      process.stdout.write(`${JSON.stringify(out)}\n`);
    }
  } finally {
    for (const c of children.reverse()) await c.stop().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
