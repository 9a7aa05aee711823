/**
 * The fleet's scale figures (issue #19), each printed with the fleet's own CPU share and the
 * machine's load average, so a reader sees when the box, not the fleet, limited a run:
 *
 *   idle     `infera-sim --fleet N` for each N in --idle (default 64,256): start-up time, RSS
 *            once up, CPU share over --idle-seconds (10) with no requests;
 *   light    `infera-sim --fleet --light-size` (256) registered with a real `infera server`
 *            (static discovery from the fleet's manifest, each engine one worker with its KV
 *            events, --policy round-robin), open-loop --rate (20) chat requests/s for
 *            --seconds (30), max_tokens 16: answers, latency, how many engines served, CPU
 *            share of the fleet and of the server.
 *
 *   node bench/sim-cpu/fleet.ts [--idle 64,256] [--light-size 256] [--rate 20] [--seconds 30]
 *     [--skip-light] [--skip-idle]
 *
 * The CPU per simulated token at 64 engines streaming, against one sim, is a row of run.ts:
 * `node bench/sim-cpu/run.ts --rows sim,fleet`.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { FleetManifest } from "../../src/engine/sim/fleet.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { parseMetric } from "../../test/helpers/sim.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const CLK_TCK = 100;
const has = (f: string): boolean => process.argv.includes(`--${f}`);
function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
const IDLE = arg("idle", "64,256").split(",").map(Number);
const LIGHT = Number(arg("light-size", "256"));
const RATE = Number(arg("rate", "20"));
const SECONDS = Number(arg("seconds", "30"));
const IDLE_SECONDS = Number(arg("idle-seconds", "10"));
const MODEL = "sim-model";

const load = (): string =>
  loadavg()
    .map((x) => x.toFixed(1))
    .join(" ");

function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / CLK_TCK;
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : 0;
}

interface Fleet {
  proc: ChildProcess;
  manifest: FleetManifest;
  startMs: number;
  stop(): Promise<void>;
}

async function startFleet(n: number): Promise<Fleet> {
  const dir = mkdtempSync(join(tmpdir(), "fleet-bench-"));
  const file = join(dir, "manifest.json");
  const kv = JSON.stringify({
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: "tcp://127.0.0.1:*",
    replay_endpoint: "tcp://127.0.0.1:*",
    topic: "kv-events",
  });
  const t0 = performance.now();
  const proc = spawn(
    process.execPath,
    [
      `${ROOT}bin/infera-sim.js`,
      "--fleet",
      String(n),
      "--fleet-manifest",
      file,
      "serve",
      MODEL,
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--kv-events-config",
      kv,
      "--speed",
      "1",
    ],
    { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, INFERA_LOG_LEVEL: "warn" } },
  );
  for (let i = 0; !existsSync(file); i++) {
    if (proc.exitCode !== null || i > 6000) throw new Error(`the fleet of ${n} did not start`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const startMs = performance.now() - t0;
  const manifest = JSON.parse(readFileSync(file, "utf8")) as FleetManifest;
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  return {
    proc,
    manifest,
    startMs,
    stop: async () => {
      proc.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function idle(n: number): Promise<void> {
  const f = await startFleet(n);
  const pid = f.proc.pid!;
  await new Promise((r) => setTimeout(r, 2000));
  const c0 = cpuSeconds(pid);
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, IDLE_SECONDS * 1000));
  const share = ((cpuSeconds(pid) - c0) / ((performance.now() - t0) / 1000)) * 100;
  console.log(
    `idle fleet of ${n}: up in ${(f.startMs / 1000).toFixed(1)} s, RSS ${rssMiB(pid).toFixed(0)} MiB ` +
      `(${((rssMiB(pid) * 1024) / n).toFixed(0)} KiB per engine); fleet CPU ${share.toFixed(2)} % of one core ` +
      `over ${IDLE_SECONDS} s idle; load average ${load()}`,
  );
  await f.stop();
}

async function startServer(
  m: FleetManifest,
): Promise<{ url: string; proc: ChildProcess; stop(): Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), "fleet-bench-server-"));
  const file = join(dir, "workers.json");
  writeFileSync(
    file,
    JSON.stringify(
      m.engines.map((e) => ({
        id: `fleet-${e.index}`,
        url: e.url,
        model: MODEL,
        servedModelNames: [MODEL],
        engine: "sim",
        role: "mixed",
        blockSize: 16,
        kvEvents: {
          endpoint: e.kvRanks[0].endpoint,
          replayEndpoint: e.kvRanks[0].replayEndpoint ?? undefined,
          topic: "kv-events",
          framing: "seq",
        },
      })),
    ),
  );
  const port = await freePort();
  const proc = spawn(
    process.execPath,
    [
      `${ROOT}bin/infera.js`,
      ...serverArgs(port),
      "--discovery",
      "static",
      "--workers-file",
      file,
      "--policy",
      "round-robin",
    ],
    { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, INFERA_LOG_LEVEL: "warn" } },
  );
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      const r = await fetch(`${url}/v1/workers`);
      const body = (await r.json()) as { data: unknown[] };
      if (body.data.length === m.engines.length) break;
    } catch {
      // not up yet
    }
    if (proc.exitCode !== null || i > 1200) throw new Error("infera server did not register the fleet");
    await new Promise((r) => setTimeout(r, 50));
  }
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  return {
    url,
    proc,
    stop: async () => {
      proc.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function light(): Promise<void> {
  const f = await startFleet(LIGHT);
  const server = await startServer(f.manifest);
  const fpid = f.proc.pid!;
  const spid = server.proc.pid!;
  const loadStart = load();
  const c0 = [cpuSeconds(fpid), cpuSeconds(spid)];
  const t0 = performance.now();
  const lat: number[] = [];
  let errors = 0;
  const inflight: Promise<void>[] = [];
  const total = Math.round(RATE * SECONDS);
  for (let k = 0; k < total; k++) {
    const due = t0 + (k * 1000) / RATE;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    inflight.push(
      (async () => {
        const s = performance.now();
        try {
          const r = await fetch(`${server.url}/v1/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({
              model: MODEL,
              messages: [{ role: "user", content: `Light load request ${k}: say something short.` }],
              max_tokens: 16,
            }),
          });
          await r.text();
          if (r.status === 200) lat.push(performance.now() - s);
          else errors++;
        } catch {
          errors++;
        }
      })(),
    );
  }
  await Promise.all(inflight);
  const wall = (performance.now() - t0) / 1000;
  const share = (pid: number, c: number): number => ((cpuSeconds(pid) - c) / wall) * 100;
  const [fleetShare, serverShare] = [share(fpid, c0[0]), share(spid, c0[1])];
  const served = await Promise.all(
    f.manifest.engines.map(async (e) => {
      const t = await (await fetch(`${e.url}/metrics`)).text();
      return parseMetric(t, "vllm:request_success_total") ?? 0;
    }),
  );
  lat.sort((a, b) => a - b);
  const q = (p: number): number => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] ?? 0;
  console.log(
    `light load over a fleet of ${LIGHT} registered with infera server (round-robin): ${total} chat requests ` +
      `at ${RATE}/s for ${SECONDS} s (max_tokens 16, --speed 1): ${lat.length} ok, ${errors} errors; ` +
      `latency p50 ${q(0.5).toFixed(0)} ms, p99 ${q(0.99).toFixed(0)} ms; engines that served: ` +
      `${served.filter((x) => x > 0).length}/${LIGHT} (min ${Math.min(...served)}, max ${Math.max(...served)} each); ` +
      `fleet CPU ${fleetShare.toFixed(1)} % of one core, server CPU ${serverShare.toFixed(1)} %; ` +
      `fleet RSS ${rssMiB(fpid).toFixed(0)} MiB, server RSS ${rssMiB(spid).toFixed(0)} MiB; ` +
      `load average ${loadStart} at start, ${load()} at end`,
  );
  await server.stop();
  await f.stop();
}

if (!has("skip-idle")) for (const n of IDLE) await idle(n);
if (!has("skip-light")) await light();
