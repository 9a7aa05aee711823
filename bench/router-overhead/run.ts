/**
 * Router overhead: the same closed-loop load against
 *   (a) a sim directly, (b) through `infera server`, (c) through nginx proxy_pass,
 *   (d) through a bare node:http + undici proxy (the Node.js floor, for reference),
 *   (i) through the same node:http server with a raw `net` upstream client instead of undici,
 *   (e) through `infera server` run from the TypeScript sources (Node's type stripping),
 *       beside (b), which runs the compiled dist/ when it is current,
 *   (j) through `infera server` as (b) with `--http-front node` (node:http parses every
 *       request; (b) has the default raw front, src/server/front/front.ts),
 * non-streamed and streamed, in one run. Prints throughput and latency percentiles, the
 * added latency of (b) and (c) over (a), and the ratios b/a and b/c.
 *
 *   node bench/router-overhead/run.ts [--requests 2000] [--concurrency 16] [--rounds 2]
 *     [--baseline <checkout>] [--dashboard-poll 1000] [--cpu-prof DIR] [--traced 1]
 *
 * `--baseline` adds (f): `infera server` run from another checkout (e.g. a `git worktree` of
 * the previous commit, built like this one), interleaved with the others, so a change to the
 * request path is compared side by side under the same load.
 *
 * (g) is (b) again, the same process, while a poller GETs /dashboard/state every
 * `--dashboard-poll` ms (the dashboard page open): printed beside (b), the dashboard closed.
 * `--dashboard-poll 0` leaves (g) out.
 *
 * The server and nginx run as child processes (nginx: one worker process, upstream
 * keepalive), so the load generator here (undici) does not share their event loop. Rounds
 * interleave a/b/c so that drift on a shared machine hits all three alike.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Pool } from "undici";
import { chooseEntry } from "../../scripts/dist-stamp.mjs";
import { handleFatalSignals, isRunning, killOnExit } from "../../src/util/child-process.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { BARE_PROXY, nginxConf } from "../reference-proxies.ts";
import { pairedArgs } from "../usage.ts";
import { dashboardPoller, dashboardStats } from "./dashboard-poller.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const args = pairedArgs(process.argv.slice(2));
const REQUESTS = Number(args.get("requests") ?? 2000);
const CONCURRENCY = Number(args.get("concurrency") ?? 16);
const ROUNDS = Number(args.get("rounds") ?? 2);
const LATENCY_REQUESTS = Number(args.get("latency-requests") ?? 1000);
/**
 * Requests per target and mode before measuring: enough for V8 to finish optimising the Node
 * targets' hot paths (its compiler threads count in the process's CPU), so the figures are
 * steady-state. 3,000 was not: `--trace-opt` on infera server (dist, non-streamed, c=16, this
 * 2-core box) counted 254 optimised compiles in the 10,000 requests after a 4,000 warm-up, then
 * 28, 3, 5, 1, 0 per further 10,000, and user CPU per request fell from 87 to ≈ 50 µs over
 * the first 20,000. nginx has no JIT; the bare Node proxies warm up faster than infera (less code).
 */
const WARMUP = Number(args.get("warmup") ?? 20000);
const NGINX = args.get("nginx") ?? "/usr/sbin/nginx";
const MAX_TOKENS = Number(args.get("max-tokens") ?? 4);
const BASELINE = args.get("baseline");
const DASHBOARD_POLL_MS = Number(args.get("dashboard-poll") ?? 1000);
/**
 * `--cpu-prof DIR`: run (b) and (f) under `node --cpu-prof`, each writing its .cpuprofile into
 * DIR/b and DIR/f when it exits (summarise with `node scripts/cpu-prof-top.mjs DIR/b`).
 */
const CPU_PROF = args.get("cpu-prof");
/**
 * `--traced 1`: adds (h), `infera server` with tracing on (`--otlp-endpoint` to a receiver in
 * this process that accepts and drops every export), to show what tracing costs when on; (b)
 * beside (f) shows it costs nothing when off.
 */
const TRACED = args.get("traced") === "1";
const profFlags = (sub: string): string[] =>
  CPU_PROF ? ["--cpu-prof", "--cpu-prof-dir", join(CPU_PROF, sub)] : [];

const children: ChildProcess[] = [];
function start(cmd: string, argv: string[], env: Record<string, string> = {}, cwd = ROOT): ChildProcess {
  const p = spawn(cmd, argv, {
    cwd,
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, INFERA_LOG_LEVEL: "warn", ...env },
  });
  let err = "";
  p.stderr?.on("data", (d) => {
    err = (err + d).slice(-4000);
  });
  p.on("exit", (code, sig) => {
    if (!stopping) console.error(`${cmd} ${argv.slice(0, 2).join(" ")} exited (${sig ?? code}): ${err}`);
  });
  children.push(p);
  return killOnExit(p);
}
let stopping = false;
function stopAll(): void {
  stopping = true;
  for (const c of children) if (isRunning(c)) c.kill("SIGTERM");
}
// Children are SIGKILLed if this process exits while they run (killOnExit, at spawn); an
// interrupt (SIGINT/SIGTERM/SIGHUP) or EPIPE on stdout stops them first.
handleFatalSignals();

async function waitHttp(url: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      const r = await fetch(url);
      await r.text();
      if (r.ok) return;
    } catch {
      // not yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not come up`);
}

/**
 * `infera server` in front of `simUrl` (engine scrapes off) as a child process, ready: its
 * process and URL. `prof` names its `--cpu-prof` subdirectory (none: not profiled).
 */
async function inferaServer(
  simUrl: string,
  o: { prof?: string; extra?: string[]; env?: Record<string, string>; cwd?: string } = {},
): Promise<{ proc: ChildProcess; url: string }> {
  const port = await freePort();
  const argv = [
    ...(o.prof ? profFlags(o.prof) : []),
    "bin/infera.js",
    ...serverArgs(port),
    "--worker",
    simUrl,
    "--scrape-interval",
    "0",
    ...(o.extra ?? []),
  ];
  const proc = start(process.execPath, argv, o.env ?? {}, o.cwd ?? ROOT);
  const url = `http://127.0.0.1:${port}`;
  await waitHttp(`${url}/ready`);
  return { proc, url };
}

/**
 * (i) node:http server (as d) with a raw upstream client instead of undici: pooled keep-alive
 * `net` sockets, the request head and body in one write, the answer's head parsed by hand
 * (Content-Length or chunked) and its bytes relayed as they come. No hardening: it prices the
 * upstream half of (d), to tell what a raw client could save (issue #32, lane U).
 */
const BARE_RAW_PROXY = `
import http from "node:http";
import net from "node:net";
const [port, upstream] = process.argv.slice(2);
const u = new URL(upstream);
const free = [];
const CRLF2 = Buffer.from("\\r\\n\\r\\n");
function getUp() {
  const s = free.pop();
  if (s) return s;
  const n = net.connect(Number(u.port), u.hostname);
  n.setNoDelay(true);
  n.on("error", () => {});
  return n;
}
function relay(up, res, head, body) {
  up.write(Buffer.concat([Buffer.from(head, "latin1"), body]));
  let buf = null, state = 0, remaining = 0, chunked = false;
  const onData = (d) => {
    buf = buf ? Buffer.concat([buf, d]) : d;
    if (state === 0) {
      const i = buf.indexOf(CRLF2);
      if (i < 0) return;
      const h = buf.latin1Slice(0, i);
      const status = Number(h.slice(9, 12));
      const lh = h.toLowerCase();
      const m = /content-length: *(\\d+)/.exec(lh);
      const ct = /content-type: *([^\\r]*)/.exec(lh);
      if (m) { remaining = Number(m[1]); chunked = false; } else chunked = true;
      res.writeHead(status, { "content-type": ct ? ct[1] : "application/json" });
      buf = buf.subarray(i + 4); state = 1;
    }
    if (!chunked) { remaining -= buf.length; if (buf.length) res.write(buf); buf = null; if (remaining <= 0) finish(); return; }
    for (;;) {
      if (remaining > 2) { const t = Math.min(remaining - 2, buf.length); if (t) res.write(buf.subarray(0, t)); remaining -= t; buf = buf.subarray(t); if (remaining > 2) return; }
      if (remaining > 0) { const t = Math.min(remaining, buf.length); remaining -= t; buf = buf.subarray(t); if (remaining > 0) return; }
      const j = buf.indexOf("\\r\\n");
      if (j < 0) return;
      const size = parseInt(buf.latin1Slice(0, j), 16);
      if (size === 0) { if (buf.length >= j + 4) return finish(); return; }
      buf = buf.subarray(j + 2); remaining = size + 2;
    }
  };
  const finish = () => { up.off("data", onData); free.push(up); res.end(); };
  up.on("data", onData);
}
http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    const head = req.method + " " + req.url + " HTTP/1.1\\r\\nhost: " + u.host + "\\r\\ncontent-type: application/json\\r\\ncontent-length: " + body.length + "\\r\\n\\r\\n";
    relay(getUp(), res, head, body);
  });
}).listen(Number(port), "127.0.0.1");
`;

interface RunResult {
  latencies: number[];
  seconds: number;
  errors: number;
}

const body = (stream: boolean, i: number) =>
  JSON.stringify({
    model: "sim-model",
    messages: [{ role: "user", content: `Benchmark request ${i % 64}: say something short.` }],
    max_tokens: MAX_TOKENS,
    stream,
  });

async function load(url: string, stream: boolean, requests: number, concurrency: number): Promise<RunResult> {
  const pool = new Pool(url, { connections: concurrency, pipelining: 1 });
  const latencies: number[] = [];
  let errors = 0;
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < requests) {
        const i = next++;
        const s = performance.now();
        try {
          const res = await pool.request({
            path: "/v1/chat/completions",
            method: "POST",
            headers: { "content-type": "application/json" },
            body: body(stream, i),
          });
          for await (const _ of res.body) {
            // drain
          }
          if (res.statusCode !== 200) errors++;
          else latencies.push(performance.now() - s);
        } catch {
          errors++;
        }
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  await pool.close();
  return { latencies, seconds, errors };
}

const pct = (sorted: number[], p: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;

/**
 * CPU seconds [user, system] used so far by a process and its children (nginx's worker). The
 * split says whether a cost is the proxy's own code or the kernel's socket work it asks for.
 */
function cpuSeconds(pid: number): [number, number] {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const out: [number, number] = [Number(f[11]) / 100, Number(f[12]) / 100];
    const kids = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
    for (const k of kids ? kids.split(" ") : []) {
      const [u, s] = cpuSeconds(Number(k));
      out[0] += u;
      out[1] += s;
    }
    return out;
  } catch {
    return [0, 0];
  }
}

/** Read and write syscalls so far of a process and its children (nginx's worker), from /proc/<pid>/io. */
function syscalls(pid: number): [number, number] {
  try {
    const io = readFileSync(`/proc/${pid}/io`, "utf8");
    const out: [number, number] = [
      Number(/syscr: (\d+)/.exec(io)?.[1] ?? 0),
      Number(/syscw: (\d+)/.exec(io)?.[1] ?? 0),
    ];
    const kids = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
    for (const k of kids ? kids.split(" ") : []) {
      const [r, w] = syscalls(Number(k));
      out[0] += r;
      out[1] += w;
    }
    return out;
  } catch {
    return [0, 0];
  }
}

interface Agg {
  latencies: number[];
  seconds: number;
  count: number;
  errors: number;
  lowConc: number[];
  /** CPU seconds the proxy process (or the sim, for a) spent during the concurrent runs. */
  cpu: number;
  /** The part of `cpu` spent in the kernel (system time). */
  sysCpu: number;
  /** Read / write syscalls of that process during the concurrent runs. */
  reads: number;
  writes: number;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "infera-bench-ro-"));
  try {
    const [simPort, nginxPort] = [await freePort(), await freePort()];
    const simProc = start(process.execPath, [
      "bin/infera-sim.js",
      "serve",
      "sim-model",
      "--host",
      "127.0.0.1",
      "--port",
      String(simPort),
      "--speed",
      "10000",
      "--max-num-seqs",
      "256",
    ]);
    const simUrl = `http://127.0.0.1:${simPort}`;
    await waitHttp(`${simUrl}/health`);
    const { proc: serverProc, url: serverUrl } = await inferaServer(simUrl, { prof: "b" });
    const { proc: nodeFrontProc, url: nodeFrontUrl } = await inferaServer(simUrl, {
      prof: "j",
      extra: ["--http-front", "node"],
    });
    // The same server run from the TypeScript sources (Node's type stripping; b runs dist/ when
    // it is built and current, see bin/infera.js), so the compiled build's effect is measured
    // side by side.
    const { proc: srcProc, url: srcUrl } = await inferaServer(simUrl, { env: { INFERA_DIST: "0" } });
    const serverFrom = chooseEntry();
    writeFileSync(
      join(dir, "nginx.conf"),
      nginxConf({
        dir,
        port: nginxPort,
        upstreams: [`127.0.0.1:${simPort}`],
        keepalive: 128,
        workerConnections: 4096,
      }),
    );
    const nginxProc = start(NGINX, ["-c", join(dir, "nginx.conf"), "-p", dir]);
    const nginxUrl = `http://127.0.0.1:${nginxPort}`;
    await waitHttp(`${nginxUrl}/health`);

    const loadStart = loadavg()[0]!.toFixed(1);
    const barePort = await freePort();
    writeFileSync(join(dir, "bare-proxy.mjs"), BARE_PROXY);
    // (d): the bare node:http + undici proxy, one Pool of 256 connections to the sim.
    const bareProc = start(process.execPath, [join(dir, "bare-proxy.mjs"), String(barePort), "256", simUrl]);
    const bareUrl = `http://127.0.0.1:${barePort}`;
    await waitHttp(`${bareUrl}/health`);
    const rawPort = await freePort();
    writeFileSync(join(dir, "bare-raw-proxy.mjs"), BARE_RAW_PROXY);
    const rawProc = start(process.execPath, [join(dir, "bare-raw-proxy.mjs"), String(rawPort), simUrl]);
    const rawUrl = `http://127.0.0.1:${rawPort}`;
    await waitHttp(`${rawUrl}/health`);
    // (g) right after (b): the same process, dashboard closed then open, as close in time as can be.
    type Key =
      | "a_direct"
      | "b_infera"
      | "j_infera_node_front"
      | "g_infera_dashboard"
      | "c_nginx"
      | "d_bare_node"
      | "i_bare_raw"
      | "e_infera_src"
      | "f_baseline"
      | "h_infera_traced";
    const targets: Partial<Record<Key, string>> = {
      a_direct: simUrl,
      b_infera: serverUrl,
      j_infera_node_front: nodeFrontUrl,
      g_infera_dashboard: serverUrl,
      c_nginx: nginxUrl,
      d_bare_node: bareUrl,
      i_bare_raw: rawUrl,
      e_infera_src: srcUrl,
    };
    if (DASHBOARD_POLL_MS <= 0) delete targets.g_infera_dashboard;
    /** Runs `f` against target `k`, with the dashboard poller on for (g). */
    const withDashboard = async <T>(k: Key, f: () => Promise<T>): Promise<T> => {
      if (k !== "g_infera_dashboard") return f();
      const stop = dashboardPoller(serverUrl, DASHBOARD_POLL_MS);
      try {
        return await f();
      } finally {
        await stop();
      }
    };
    const pids: Partial<Record<Key, number>> = {
      a_direct: simProc.pid!,
      b_infera: serverProc.pid!,
      j_infera_node_front: nodeFrontProc.pid!,
      c_nginx: nginxProc.pid!,
      d_bare_node: bareProc.pid!,
      i_bare_raw: rawProc.pid!,
      e_infera_src: srcProc.pid!,
      g_infera_dashboard: serverProc.pid!,
    };
    if (BASELINE) {
      const base = await inferaServer(simUrl, { prof: "f", cwd: BASELINE });
      targets.f_baseline = base.url;
      pids.f_baseline = base.proc.pid!;
    }
    if (TRACED) {
      const sink = createServer((req, res) => {
        req.resume();
        req.on("end", () => res.end("{}"));
      });
      await new Promise<void>((r) => sink.listen(0, "127.0.0.1", r));
      sink.unref();
      const sinkUrl = `http://127.0.0.1:${(sink.address() as AddressInfo).port}`;
      const traced = await inferaServer(simUrl, { extra: ["--otlp-endpoint", sinkUrl] });
      targets.h_infera_traced = traced.url;
      pids.h_infera_traced = traced.proc.pid!;
    }
    const keys = Object.keys(targets) as Key[];
    const results: Record<string, Record<Key, Agg>> = {};
    for (const stream of [false, true]) {
      const mode = stream ? "streamed" : "non-streamed";
      const agg = {} as Record<Key, Agg>;
      for (const k of keys) {
        agg[k] = {
          latencies: [],
          seconds: 0,
          count: 0,
          errors: 0,
          lowConc: [],
          cpu: 0,
          sysCpu: 0,
          reads: 0,
          writes: 0,
        };
        // warm-up (JIT, pools); (g) shares (b)'s process, warmed again with the poller on.
        await withDashboard(k, () => load(targets[k]!, stream, WARMUP, CONCURRENCY));
      }
      for (let r = 0; r < ROUNDS; r++) {
        for (const k of keys) {
          const cpuPid = pids[k]!;
          const cpu0 = cpuSeconds(cpuPid);
          const io0 = syscalls(cpuPid);
          const res = await withDashboard(k, () => load(targets[k]!, stream, REQUESTS, CONCURRENCY));
          const cpu1 = cpuSeconds(cpuPid);
          agg[k].cpu += cpu1[0] + cpu1[1] - cpu0[0] - cpu0[1];
          agg[k].sysCpu += cpu1[1] - cpu0[1];
          const io1 = syscalls(cpuPid);
          agg[k].reads += io1[0] - io0[0];
          agg[k].writes += io1[1] - io0[1];
          agg[k].latencies.push(...res.latencies);
          agg[k].seconds += res.seconds;
          agg[k].count += res.latencies.length;
          agg[k].errors += res.errors;
          // Concurrency 1: the added latency of one hop, without queueing.
          const low = await withDashboard(k, () => load(targets[k]!, stream, LATENCY_REQUESTS, 1));
          agg[k].lowConc.push(...low.latencies);
        }
      }
      results[mode] = agg;
    }

    const load1 = loadavg()[0]!.toFixed(1);
    const out = (l: string) => console.log(l);
    out(`machine: ${cpus().length} cores, load average ${loadStart} at start, ${load1} at end`);
    out(
      `router-overhead: ${REQUESTS} req × ${ROUNDS} rounds per target at concurrency ${CONCURRENCY} (+${LATENCY_REQUESTS} × ${ROUNDS} at concurrency 1), max_tokens ${MAX_TOKENS}, sim --speed 10000`,
    );
    for (const [mode, agg] of Object.entries(results)) {
      const stat = (k: Key) => {
        const s = [...agg[k].latencies].sort((x, y) => x - y);
        const l = [...agg[k].lowConc].sort((x, y) => x - y);
        return {
          rps: agg[k].count / agg[k].seconds,
          p50: pct(s, 50),
          p99: pct(s, 99),
          l50: pct(l, 50),
          l99: pct(l, 99),
          errors: agg[k].errors,
          cpuUs: (agg[k].cpu / Math.max(1, agg[k].count)) * 1e6,
          sysUs: (agg[k].sysCpu / Math.max(1, agg[k].count)) * 1e6,
          sys: `${(agg[k].reads / Math.max(1, agg[k].count)).toFixed(2)} / ${(agg[k].writes / Math.max(1, agg[k].count)).toFixed(2)}`,
        };
      };
      const a = stat("a_direct");
      const b = stat("b_infera");
      const c = stat("c_nginx");
      const d = stat("d_bare_node");
      const i = stat("i_bare_raw");
      const e = stat("e_infera_src");
      const j = stat("j_infera_node_front");
      const f = BASELINE ? stat("f_baseline") : null;
      const h = TRACED ? stat("h_infera_traced") : null;
      out(`\n${mode}`);
      out(
        "| target | req/s | p50 ms | p99 ms | c=1 p50 ms | c=1 p99 ms | CPU µs/req (process) | of which kernel | read/write syscalls per req | errors |",
      );
      out("|---|---|---|---|---|---|---|---|---|---|");
      const g = keys.includes("g_infera_dashboard") ? stat("g_infera_dashboard") : null;
      for (const [name, s] of [
        ["a sim direct", a],
        [`b infera server (${serverFrom === "dist" ? "dist/" : "src, type-stripped"})`, b],
        ["j = b with --http-front node", j],
        ["c nginx", c],
        ["d bare node:http+undici proxy", d],
        ["i bare node:http+raw net upstream", i],
        ["e infera server, src (type stripping)", e],
        ...(f ? ([[`f baseline infera server (${BASELINE})`, f]] as const) : []),
        ...(h ? ([["h = b with tracing on (--otlp-endpoint)", h]] as const) : []),
        ...(g ? ([[`g = b with the dashboard polled every ${DASHBOARD_POLL_MS} ms`, g]] as const) : []),
      ] as const) {
        out(
          `| ${name} | ${s.rps.toFixed(0)} | ${s.p50.toFixed(3)} | ${s.p99.toFixed(3)} | ${s.l50.toFixed(3)} | ${s.l99.toFixed(3)} | ${s.cpuUs.toFixed(0)} | ${s.sysUs.toFixed(0)} | ${s.sys} | ${s.errors} |`,
        );
      }
      out(
        `added latency at c=1 (b−a): p50 ${(b.l50 - a.l50).toFixed(3)} ms, p99 ${(b.l99 - a.l99).toFixed(3)} ms;  nginx (c−a): p50 ${(c.l50 - a.l50).toFixed(3)} ms, p99 ${(c.l99 - a.l99).toFixed(3)} ms`,
      );
      out(
        `added latency at c=${CONCURRENCY} (b−a): p50 ${(b.p50 - a.p50).toFixed(3)} ms, p99 ${(b.p99 - a.p99).toFixed(3)} ms`,
      );
      out(
        `throughput ratios: b/a ${(b.rps / a.rps).toFixed(2)}, b/c ${(b.rps / c.rps).toFixed(2)}, b/d ${(b.rps / d.rps).toFixed(2)}`,
      );
      out(
        `infera CPU per request, b (${serverFrom}) vs e (src, type-stripped): ${b.cpuUs.toFixed(0)} vs ${e.cpuUs.toFixed(0)} µs (b/e ${(b.cpuUs / e.cpuUs).toFixed(2)}); throughput b/e ${(b.rps / e.rps).toFixed(2)}, e/c ${(e.rps / c.rps).toFixed(2)}`,
      );
      out(
        `raw front (b) vs node:http front (j): CPU ${b.cpuUs.toFixed(0)} vs ${j.cpuUs.toFixed(0)} µs/req (b/j ${(b.cpuUs / j.cpuUs).toFixed(2)}); req/s b/j ${(b.rps / j.rps).toFixed(2)}; p99 ${b.p99.toFixed(3)} vs ${j.p99.toFixed(3)} ms; j/c CPU ${(j.cpuUs / c.cpuUs).toFixed(2)}×, b/c CPU ${(b.cpuUs / c.cpuUs).toFixed(2)}×`,
      );
      if (h)
        out(
          `tracing on (h) vs off (b): CPU ${h.cpuUs.toFixed(0)} vs ${b.cpuUs.toFixed(0)} µs/req (h/b ${(h.cpuUs / b.cpuUs).toFixed(2)}); req/s h/b ${(h.rps / b.rps).toFixed(2)}`,
        );
      if (f) {
        out(
          `this checkout (b) vs baseline (f): CPU ${b.cpuUs.toFixed(0)} vs ${f.cpuUs.toFixed(0)} µs/req (b/f ${(b.cpuUs / f.cpuUs).toFixed(2)}); req/s ${b.rps.toFixed(0)} vs ${f.rps.toFixed(0)} (b/f ${(b.rps / f.rps).toFixed(2)}); c=1 p50 ${b.l50.toFixed(3)} vs ${f.l50.toFixed(3)} ms, p99 ${b.l99.toFixed(3)} vs ${f.l99.toFixed(3)} ms; f/c ${(f.rps / c.rps).toFixed(2)}`,
        );
      }
      out(
        g
          ? `dashboard closed (b) vs open (g): req/s ${b.rps.toFixed(0)} vs ${g.rps.toFixed(0)}, CPU µs/req ${b.cpuUs.toFixed(0)} vs ${g.cpuUs.toFixed(0)}, c=1 p50 ${b.l50.toFixed(3)} vs ${g.l50.toFixed(3)} ms, p99 ${b.l99.toFixed(3)} vs ${g.l99.toFixed(3)} ms`
          : "dashboard: not measured (--dashboard-poll 0)",
      );
      if (g)
        out(
          `dashboard polls over the whole run (both modes): ${dashboardStats.polls} (${dashboardStats.failed} failed), mean ${(dashboardStats.ms / Math.max(1, dashboardStats.polls)).toFixed(2)} ms each`,
        );
      out(
        `proxy CPU per request: infera ${b.cpuUs.toFixed(0)} µs, nginx ${c.cpuUs.toFixed(0)} µs → one core sustains ≈ ${(1e6 / b.cpuUs).toFixed(0)} vs ${(1e6 / c.cpuUs).toFixed(0)} req/s (ratio ${(c.cpuUs / b.cpuUs).toFixed(2)}); bare Node proxy ${d.cpuUs.toFixed(0)} µs`,
      );
    }
  } finally {
    const exited = children.filter(isRunning).map((c) => new Promise((r) => c.once("exit", r)));
    stopAll();
    // A profiled server writes its .cpuprofile as it exits: wait for it (bounded).
    await Promise.race([Promise.all(exited), new Promise((r) => setTimeout(r, CPU_PROF ? 15_000 : 300))]);
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
