/**
 * How infera server's CPU per request settles as V8 optimises it: one sim, `infera server`
 * (dist/ when current) in front, a closed loop of requests at concurrency 16, measured in
 * consecutive chunks from the first request on. Per chunk it prints the server's user and
 * kernel CPU per request (from /proc) and req/s. The chunks show how many requests a
 * benchmark must warm up before its figures are steady-state (see RESULTS.md, 2026-12-05
 * 04:20: ≈ 15,000 on this 2-core box).
 *
 *   node bench/router-overhead/warmup.ts [--chunks 8] [--chunk 5000] [--stream 0]
 *     [--perf-from K]
 *
 * `--perf-from K` records chunks K.. under `perf record -g` (Linux perf, with the server run
 * under `--perf-basic-prof` so JIT frames have names) into ./perf.data; `perf report
 * --no-children --sort sym` then lists self time by function. Unlike `--cpu-prof`, whose
 * samples are wall-clock (a write that wakes the peer on a 2-core box and is preempted shows
 * as seconds of `writev`), perf samples CPU time only.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { handleFatalSignals, killOnExit } from "../../src/util/child-process.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { startSim } from "../../test/helpers/sim.ts";
import { waitFor200 } from "../../test/helpers/wait.ts";
import { cpuOf } from "../fleet-scale/measure.ts";
import { exitWithUsageIfAsked, pairedArgs } from "../usage.ts";
import { closedLoop } from "./closed-loop.ts";

exitWithUsageIfAsked(import.meta.url, process.argv.slice(2));

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const args = pairedArgs(process.argv.slice(2));
const CHUNKS = Number(args.get("chunks") ?? 8);
const CHUNK = Number(args.get("chunk") ?? 5000);
const STREAM = args.get("stream") === "1";
const PERF_FROM = args.has("perf-from") ? Number(args.get("perf-from")) : null;

handleFatalSignals();

/** [user, kernel] CPU seconds of a process so far. */
function cpu(pid: number): [number, number] {
  const s = cpuOf(pid);
  if (!s) throw new Error(`infera server (pid ${pid}) is gone`);
  return [s.cpu - s.sys, s.sys];
}

const load = (url: string, n: number): Promise<number> => closedLoop(url, n, STREAM);

async function main(): Promise<void> {
  const sim = await startSim({ args: ["--speed", "10000", "--max-num-seqs", "256"] });
  const port = await freePort();
  const server: ChildProcess = killOnExit(
    spawn(
      process.execPath,
      [
        ...(PERF_FROM !== null ? ["--perf-basic-prof"] : []),
        "bin/infera.js",
        ...serverArgs(port),
        "--worker",
        sim.url,
        "--scrape-interval",
        "0",
      ],
      { cwd: ROOT, stdio: "ignore", env: { ...process.env, INFERA_LOG_LEVEL: "warn" } },
    ),
  );
  const url = `http://127.0.0.1:${port}`;
  let perf: ChildProcess | null = null;
  try {
    await waitFor200(`${url}/ready`, { timeoutMs: 30_000, what: "infera server" });
    console.log(
      `warmup: ${CHUNKS} chunks of ${CHUNK} requests, ${STREAM ? "streamed" : "non-streamed"}, c=16; load average ${loadavg()[0]!.toFixed(1)}`,
    );
    console.log("| chunk | requests before | user µs/req | kernel µs/req | req/s | errors |");
    console.log("|---|---|---|---|---|---|");
    for (let k = 0; k < CHUNKS; k++) {
      if (k === PERF_FROM) {
        perf = spawn("perf", ["record", "-F", "999", "-g", "-p", String(server.pid), "-o", "perf.data"], {
          stdio: "ignore",
        });
        await new Promise((r) => setTimeout(r, 500));
      }
      const c0 = cpu(server.pid!);
      const t0 = performance.now();
      const errors = await load(url, CHUNK);
      const seconds = (performance.now() - t0) / 1000;
      const c1 = cpu(server.pid!);
      const per = (s: number) => ((s * 1e6) / CHUNK).toFixed(0);
      console.log(
        `| ${k} | ${k * CHUNK} | ${per(c1[0] - c0[0])} | ${per(c1[1] - c0[1])} | ${(CHUNK / seconds).toFixed(0)} | ${errors} |`,
      );
    }
    console.log(`load average at the end ${loadavg()[0]!.toFixed(1)}`);
  } finally {
    if (perf) {
      perf.kill("SIGINT");
      await new Promise((r) => perf!.once("exit", r));
      console.log("perf: ./perf.data (perf report --no-children --sort sym)");
    }
    server.kill();
    await sim.stop();
  }
}

await main();
