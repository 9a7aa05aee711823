/**
 * NATS request plane vs HTTP, side by side in one run, against the same simulated engine.
 *
 *   node bench/nats/run.ts [--requests N] [--concurrency C] [--seconds S] [--baseline DIR]
 *
 * HTTP: the server's HttpExecutor → sim. NATS: NatsRequestExecutor → nats-server → the agent
 * (its own process, as under `infera engine`) → HTTP on the agent's host → sim. Measures, per
 * plane: sequential latency of non-streamed completions and time to first chunk / last chunk
 * of streamed ones (p50/p99; the NATS figure minus the HTTP one is the added latency), then
 * throughput at a fixed concurrency (requests/s and SSE chunks/s). The sim runs at a high
 * --speed so the engine's own time is small next to the transport's.
 *
 * `--baseline DIR` adds a third plane, "nats-base": the same executor to a second agent process
 * run from another checkout (DIR/bench/nats/agent-proc.ts, e.g. `git archive` of an earlier
 * commit with a node_modules symlink), interleaved with the others; and reports each agent's
 * CPU (user + system, /proc/<pid>/stat) per request, per phase, to compare agents side by side.
 * `--agent-prof DIR`: every agent process runs with --cpu-prof into DIR/<worker id>/
 * (summarise with scripts/cpu-prof-top.mjs).
 */

import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import type { RequestExecutor, WorkerState } from "../../src/router/types.ts";
import { HttpExecutor } from "../../src/transport/http.ts";
import { NatsRequestExecutor } from "../../src/transport/nats/client.ts";
import { connectNats } from "../../src/transport/nats/connection.ts";
import { requestSubject } from "../../src/transport/nats/subjects.ts";
import { startNats } from "../../test/helpers/nats.ts";
import { startSim } from "../../test/helpers/sim.ts";

process.env.INFERA_LOG_LEVEL ??= "warn";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
}
const N = arg("requests", 400);
const CONC = arg("concurrency", 32);
const SECONDS = arg("seconds", 8);
const MODEL = "bench-model";
const strArg = (name: string): string | undefined => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const BASELINE = strArg("baseline");
/** `--agent-prof DIR`: each agent process writes a CPU profile under DIR/<worker id>/. */
const AGENT_PROF = strArg("agent-prof");

/** User + system CPU of process `pid` so far, in µs (/proc/<pid>/stat, 100 ticks/s). */
function cpuUs(pid: number | undefined): number {
  if (pid === undefined) return 0;
  const f = readFileSync(`/proc/${pid}/stat`, "utf8");
  const rest = f.slice(f.lastIndexOf(")") + 2).split(" ");
  return (Number(rest[11]) + Number(rest[12])) * 10_000;
}

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

/** A fresh signal per request, as the server gives each client request its own. */
const sig = () => new AbortController().signal;

async function nonStreamed(exec: RequestExecutor, w: WorkerState, i: number): Promise<void> {
  const up = await exec.send(
    w,
    "completion",
    { model: MODEL, prompt: `request ${i} asks a short question`, max_tokens: 16, seed: i },
    { signal: sig() },
  );
  await up.json();
}

async function streamed(exec: RequestExecutor, w: WorkerState, i: number): Promise<[number, number, number]> {
  const t0 = performance.now();
  const up = await exec.send(
    w,
    "completion",
    { model: MODEL, prompt: `stream ${i} wants tokens`, max_tokens: 64, seed: i, stream: true },
    { signal: sig() },
  );
  let first = 0;
  let events = 0;
  for await (const c of up.body) {
    if (first === 0) first = performance.now() - t0;
    // SSE events in this chunk ("\n\n"-terminated), whatever the transport's chunking.
    for (let i = c.indexOf(10); i >= 0 && i < c.length - 1; i = c.indexOf(10, i + 2))
      if (c[i + 1] === 10) events++;
  }
  return [first, performance.now() - t0, events];
}

interface PlaneResult {
  plane: string;
  /** The agent process of a NATS plane (for its CPU). */
  pid?: number;
  w: WorkerState;
  exec: RequestExecutor;
  /** Agent CPU µs and requests: sequential (latency) phase, concurrent (throughput) phase. */
  cpuSeq: number;
  reqSeq: number;
  cpuConc: number;
  ns: number[];
  ttfc: number[];
  e2e: number[];
  done: number;
  events: number;
  secs: number;
}

function plane(name: string, exec: RequestExecutor, w: WorkerState, pid?: number): PlaneResult {
  return {
    plane: name,
    pid,
    w,
    exec,
    cpuSeq: 0,
    reqSeq: 0,
    cpuConc: 0,
    ns: [],
    ttfc: [],
    e2e: [],
    done: 0,
    events: 0,
    secs: 0,
  };
}

/** Latency: the planes alternate request by request, so machine noise hits both alike. */
async function latency(planes: PlaneResult[]): Promise<void> {
  for (const r of planes) for (let i = 0; i < 50; i++) await nonStreamed(r.exec, r.w, i); // warm-up
  const cpu0 = planes.map((r) => cpuUs(r.pid));
  for (let i = 0; i < N; i++) {
    for (const r of planes) {
      const t0 = performance.now();
      await nonStreamed(r.exec, r.w, i);
      r.ns.push(performance.now() - t0);
    }
  }
  for (let i = 0; i < N / 2; i++) {
    for (const r of planes) {
      const [f, t] = await streamed(r.exec, r.w, i);
      r.ttfc.push(f);
      r.e2e.push(t);
    }
  }
  planes.forEach((r, k) => {
    r.cpuSeq += cpuUs(r.pid) - cpu0[k]!;
    r.reqSeq += N + N / 2;
  });
}

/** Throughput: CONC closed-loop streaming clients for a window; windows alternate between planes. */
async function throughput(r: PlaneResult, seconds: number): Promise<void> {
  const { exec, w } = r;
  const end = performance.now() + seconds * 1000;
  const t0 = performance.now();
  const cpu0 = cpuUs(r.pid);
  await Promise.all(
    Array.from({ length: CONC }, async (_, k) => {
      for (let i = 0; performance.now() < end; i++) {
        const [, , ev] = await streamed(exec, w, k * 100000 + i);
        r.done++;
        r.events += ev;
      }
    }),
  );
  r.secs += (performance.now() - t0) / 1000;
  r.cpuConc += cpuUs(r.pid) - cpu0;
}

/** Per-chunk path: big SSE streams from a stand-in engine; bytes/s and transport chunks/s. */
async function chunkPhase(
  exec: RequestExecutor,
  w: WorkerState,
  pid?: number,
): Promise<{ mbps: number; chunksPerS: number; cpuUsPerMb: number }> {
  const cpu0 = cpuUs(pid);
  let bytes = 0;
  let chunks = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: 4 }, async () => {
      for (let r = 0; r < 3; r++) {
        const up = await exec.send(w, "chat", { stream: true }, { signal: sig() });
        for await (const c of up.body) {
          bytes += c.length;
          chunks++;
        }
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  return {
    mbps: bytes / secs / 1e6,
    chunksPerS: chunks / secs,
    cpuUsPerMb: (cpuUs(pid) - cpu0) / (bytes / 1e6),
  };
}

async function startLineProc(args: string[]): Promise<[ChildProcess, string]> {
  const child = spawn(process.execPath, [...args], {
    stdio: ["ignore", "pipe", "inherit"],
    env: process.env,
  });
  const rl = createInterface({ input: child.stdout! });
  const first = await new Promise<string>((resolve, reject) => {
    rl.once("line", resolve);
    child.once("exit", (c) => reject(new Error(`${args[0]} exited ${c}`)));
  });
  return [child, first];
}

async function startAgentProc(
  natsUrl: string,
  engineUrl: string,
  workerId: string,
  script = "bench/nats/agent-proc.ts",
): Promise<ChildProcess> {
  const prof = AGENT_PROF ? ["--cpu-prof", "--cpu-prof-dir", `${AGENT_PROF}/${workerId}`] : [];
  const child = spawn(process.execPath, [...prof, script, natsUrl, engineUrl, MODEL, workerId], {
    stdio: ["ignore", "pipe", "inherit"],
    env: process.env,
  });
  const rl = createInterface({ input: child.stdout! });
  await new Promise<void>((resolve, reject) => {
    rl.on("line", (l) => l === "ready" && resolve());
    child.once("exit", (c) => reject(new Error(`agent exited ${c}`)));
  });
  return child;
}

/** A worker record for agent `id` on `url`. */
function workerOn(id: string, url: string): WorkerState {
  const record: WorkerRecord = {
    id,
    model: MODEL,
    servedModelNames: [MODEL],
    engine: "sim",
    role: "mixed",
    url,
    connector: { kind: "none" },
    blockSize: 16,
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
    natsSubject: requestSubject(MODEL, id),
  };
  return { record, inFlight: 0, pendingPrefillTokens: 0, available: true };
}

const baseScript = (dir: string) => `${dir.replace(/\/$/, "")}/bench/nats/agent-proc.ts`;

async function main(): Promise<void> {
  const nats = await startNats();
  const sim = await startSim({ model: MODEL, args: ["--speed", "1000", "--max-num-seqs", "256"] });
  const agents = [await startAgentProc(nats.url, sim.url, "w1")];
  if (BASELINE) agents.push(await startAgentProc(nats.url, sim.url, "w1b", baseScript(BASELINE)));
  const nc = await connectNats({ url: nats.url, name: "bench-server" });
  const http = new HttpExecutor();
  const natsExec = new NatsRequestExecutor({ nc });
  const stop: ChildProcess[] = [];
  try {
    console.log(
      `NATS vs HTTP request plane — sim --speed 1000, ${N} sequential non-streamed (16 tok), ` +
        `${N / 2} sequential streamed (64 tok), then ${CONC} concurrent streams for ${SECONDS}s`,
    );
    const h = plane("http", http, workerOn("w1", sim.url));
    const n = plane("nats", natsExec, workerOn("w1", sim.url), agents[0]!.pid);
    const planes = [h, n];
    if (BASELINE) planes.push(plane("nats-base", natsExec, workerOn("w1b", sim.url), agents[1]!.pid));
    await latency(planes);
    for (let round = 0; round < 2; round++) for (const r of planes) await throughput(r, SECONDS / 2);
    // Per-chunk phase: 4 concurrent streams × 3 requests of 20k SSE events (~2 MB each).
    const [chunkEngine, chunkUrl] = await startLineProc(["bench/nats/chunk-engine.ts", "20000"]);
    stop.push(chunkEngine);
    const chunky = await startAgentProc(nats.url, chunkUrl, "chunky");
    stop.push(chunky);
    const chunks = [{ plane: "http", ...(await chunkPhase(http, workerOn("chunky", chunkUrl))) }];
    chunks.push({ plane: "nats", ...(await chunkPhase(natsExec, workerOn("chunky", chunkUrl), chunky.pid)) });
    if (BASELINE) {
      const chunkyBase = await startAgentProc(nats.url, chunkUrl, "chunky-b", baseScript(BASELINE));
      stop.push(chunkyBase);
      const cw = workerOn("chunky-b", chunkUrl);
      chunks.push({ plane: "nats-base", ...(await chunkPhase(natsExec, cw, chunkyBase.pid)) });
    }
    report(planes, chunks);
  } finally {
    for (const c of stop) c.kill("SIGTERM");
    natsExec.close();
    await http.close();
    await nc.close();
    for (const a of agents) a.kill("SIGTERM");
    await sim.stop();
    await nats.close();
  }
}

function report(
  planes: PlaneResult[],
  chunks: { plane: string; mbps: number; chunksPerS: number; cpuUsPerMb: number }[],
): void {
  const [h, n] = planes as [PlaneResult, PlaneResult];
  const f = (x: number) => x.toFixed(2).padStart(8);
  console.log(
    "plane     | non-stream p50  p99 ms | first chunk p50  p99 ms | last chunk p50  p99 ms | req/s   | SSE events/s | agent CPU µs/req seq, conc",
  );
  for (const r of planes) {
    const cpu =
      r.pid === undefined
        ? ""
        : `${(r.cpuSeq / r.reqSeq).toFixed(0)}, ${(r.cpuConc / Math.max(1, r.done)).toFixed(0)}`;
    console.log(
      `${r.plane.padEnd(9)} | ${f(pct(r.ns, 50))} ${f(pct(r.ns, 99))}     | ${f(pct(r.ttfc, 50))} ${f(pct(r.ttfc, 99))}       | ` +
        `${f(pct(r.e2e, 50))} ${f(pct(r.e2e, 99))}      | ${(r.done / r.secs).toFixed(0).padStart(7)} | ${(r.events / r.secs).toFixed(0).padStart(12)} | ${cpu}`,
    );
  }
  const d = (a: number[], b: number[], p: number) => (pct(b, p) - pct(a, p)).toFixed(2);
  console.log(
    `added latency (nats − http): non-stream p50 ${d(h.ns, n.ns, 50)} ms, p99 ${d(h.ns, n.ns, 99)} ms; ` +
      `first chunk p50 ${d(h.ttfc, n.ttfc, 50)} ms, p99 ${d(h.ttfc, n.ttfc, 99)} ms; ` +
      `last chunk p50 ${d(h.e2e, n.e2e, 50)} ms`,
  );
  console.log(
    `per-chunk path (4 × 3 × 2 MB SSE streams from a stand-in engine): ` +
      chunks
        .map(
          (c) =>
            `${c.plane} ${c.mbps.toFixed(0)} MB/s (${c.chunksPerS.toFixed(0)} chunks/s` +
            `${c.plane === "http" ? "" : `, agent ${c.cpuUsPerMb.toFixed(0)} µs CPU/MB`})`,
        )
        .join(", "),
  );
  console.log(
    `throughput ratio (nats / http) at ${CONC} streams: requests ${(n.done / n.secs / (h.done / h.secs)).toFixed(2)}×, ` +
      `SSE events ${(n.events / n.secs / (h.events / h.secs)).toFixed(2)}×`,
  );
}

await main();
