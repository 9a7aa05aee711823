/**
 * `infera up`: the server in-process with memory discovery, plus N simulated engines as child
 * processes (`bin/infera-sim.js serve …`, vLLM's command line), each added to discovery once
 * its /health answers. Ctrl-C / SIGTERM stops the children (TERM, then KILL after a grace
 * period) and the server; an exit handler kills any child still alive, so none is orphaned.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { request } from "undici";
import { envVar } from "../config/env-table.ts";
import { completeRecord } from "../discovery/static.ts";
import type { WorkerRecord } from "../discovery/types.ts";
import { type InferaServer, startServer } from "./app.ts";

export interface UpOptions {
  workers: number;
  model: string;
  policy: string;
  port: number;
  host: string;
  speed?: number;
  simArgs: readonly string[];
  apiKeys: readonly string[];
  /** Where progress lines go (default stderr); the URL and curl go to stdout. */
  progress?: (line: string) => void;
  out?: (line: string) => void;
  /** Install SIGINT/SIGTERM handlers and exit the process on stop (the CLI); tests pass false. */
  handleSignals?: boolean;
}

export interface SimChild {
  index: number;
  url: string;
  port: number;
  kvPort: number;
  replayPort: number;
  proc: ChildProcess;
  record?: WorkerRecord;
  exited: boolean;
}

export interface LocalCluster {
  server: InferaServer;
  sims: SimChild[];
  stop(): Promise<void>;
}

const SIM_BIN = fileURLToPath(new URL("../../bin/infera-sim.js", import.meta.url));
const BLOCK_SIZE = 16;

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      srv.close(() => resolve(port));
    });
  });
}

async function waitHealthy(sim: SimChild, timeoutMs: number, stderrTail: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (sim.exited) throw new Error(`sim ${sim.index} exited during start-up:\n${stderrTail()}`);
    try {
      const res = await request(`${sim.url}/health`, { signal: AbortSignal.timeout(1000) });
      await res.body.dump();
      if (res.statusCode === 200) return;
    } catch {
      // Not listening yet.
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`sim ${sim.index} did not become healthy within ${timeoutMs} ms:\n${stderrTail()}`);
}

function spawnSim(index: number, o: UpOptions, port: number, kvPort: number, replayPort: number) {
  const kvConfig = {
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: `tcp://127.0.0.1:${kvPort}`,
    replay_endpoint: `tcp://127.0.0.1:${replayPort}`,
    topic: "kv-events",
  };
  const args = [
    SIM_BIN,
    "serve",
    o.model,
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
    "--served-model-name",
    o.model,
    "--block-size",
    String(BLOCK_SIZE),
    "--kv-events-config",
    JSON.stringify(kvConfig),
    "--seed",
    String(index),
    ...(o.speed !== undefined ? ["--speed", String(o.speed)] : []),
    ...o.simArgs,
  ];
  const proc = spawn(process.execPath, args, {
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, INFERA_LOG_LEVEL: envVar("INFERA_LOG_LEVEL") ?? "warn" },
  });
  const sim: SimChild = {
    index,
    url: `http://127.0.0.1:${port}`,
    port,
    kvPort,
    replayPort,
    proc,
    exited: false,
  };
  let tail = "";
  proc.stderr?.on("data", (c: Buffer) => {
    tail = (tail + c.toString("utf8")).slice(-4000);
  });
  proc.on("exit", () => {
    sim.exited = true;
  });
  return { sim, stderrTail: () => tail };
}

export async function startLocalCluster(o: UpOptions): Promise<LocalCluster> {
  if (!Number.isInteger(o.workers) || o.workers < 1)
    throw new Error(`--workers must be ≥ 1, got ${o.workers}`);
  const progress = o.progress ?? ((l: string) => process.stderr.write(`${l}\n`));
  const server = await startServer({
    host: o.host,
    port: o.port,
    policy: o.policy,
    apiKeys: [...o.apiKeys],
    discovery: { kind: "memory" },
  });
  const memory = server.memory!;
  const sims: SimChild[] = [];
  let stopped: Promise<void> | null = null;
  const killAll = (signal: NodeJS.Signals) => {
    for (const s of sims) if (!s.exited) s.proc.kill(signal);
  };
  const onExit = () => killAll("SIGKILL");
  process.on("exit", onExit);

  const stop = (): Promise<void> => {
    stopped ??= (async () => {
      for (const s of sims) if (s.record) memory.remove(s.record.id);
      killAll("SIGTERM");
      const grace = setTimeout(() => killAll("SIGKILL"), 5000);
      await Promise.all(
        sims.map((s) => (s.exited ? undefined : new Promise<void>((r) => s.proc.once("exit", () => r())))),
      );
      clearTimeout(grace);
      await server.close();
      process.off("exit", onExit);
    })();
    return stopped;
  };

  try {
    progress(`infera up: server on ${server.url}; starting ${o.workers} sim worker(s) for '${o.model}'…`);
    let ready = 0;
    await Promise.all(
      Array.from({ length: o.workers }, async (_, i) => {
        const [port, kvPort, replayPort] = [await freePort(), await freePort(), await freePort()];
        const { sim, stderrTail } = spawnSim(i, o, port, kvPort, replayPort);
        sims.push(sim);
        await waitHealthy(sim, 60_000, stderrTail);
        sim.record = completeRecord({
          id: `sim-${i}@127.0.0.1:${port}`,
          url: sim.url,
          model: o.model,
          servedModelNames: [o.model],
          engine: "sim",
          role: "mixed",
          blockSize: BLOCK_SIZE,
          kvEvents: {
            endpoint: `tcp://127.0.0.1:${kvPort}`,
            replayEndpoint: `tcp://127.0.0.1:${replayPort}`,
            topic: "kv-events",
            framing: "seq",
          },
          labels: { pid: String(sim.proc.pid ?? "") },
        });
        memory.put(sim.record);
        ready++;
        progress(`  worker ${ready}/${o.workers} ready: ${sim.url} (pid ${sim.proc.pid})`);
        sim.proc.once("exit", (code, signal) => {
          if (stopped || !sim.record) return;
          progress(`  worker ${sim.url} exited (${signal ?? code}); removed from the cluster`);
          memory.remove(sim.record.id);
        });
      }),
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { server, sims, stop };
}

/** The CLI entry: start, print how to use it, stop cleanly on Ctrl-C / SIGTERM. */
export async function runUp(o: UpOptions): Promise<void> {
  const out = o.out ?? ((l: string) => process.stdout.write(`${l}\n`));
  let cluster: LocalCluster;
  try {
    cluster = await startLocalCluster(o);
  } catch (err) {
    process.stderr.write(`infera up failed: ${(err as Error).message}\n`);
    process.exit(1);
  }
  const { server } = cluster;
  const auth = o.apiKeys.length > 0 ? ` -H 'Authorization: Bearer <your key>'` : "";
  const body = JSON.stringify({
    model: o.model,
    messages: [{ role: "user", content: "Hello!" }],
    max_tokens: 32,
  });
  out(`Infera is up: ${server.url} (${cluster.sims.length} workers, model '${o.model}', policy ${o.policy})`);
  out(
    `Try:\n  curl ${server.url}/v1/chat/completions -H 'Content-Type: application/json'${auth} -d '${body}'`,
  );
  out(`Dashboard: ${server.url}/dashboard${o.apiKeys.length > 0 ? "?key=<your key>" : ""}`);
  out("Press Ctrl-C to stop.");
  let stopping = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`\ninfera up: ${sig}, stopping…\n`);
    cluster.stop().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
}
