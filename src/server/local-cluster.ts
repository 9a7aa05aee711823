/**
 * `infera up`: the server in-process with memory discovery, plus N simulated engines run as
 * ONE fleet child process (`bin/infera-sim.js --fleet N --fleet-manifest F serve …`, vLLM's
 * command line; src/engine/sim/fleet.ts). Each engine of the fleet is a worker of its own
 * (own URL, KV events, metrics), added to discovery once the fleet's manifest is written.
 * SIGTERM drains the server as `infera server` does (requests in flight finish within
 * --drain-timeout), then stops the fleet (TERM, then KILL after a grace period); Ctrl-C stops
 * at once. A fleet that dies is restarted with backoff (1 s doubling to 30 s), said on stderr.
 * An exit handler kills the fleet if it is still alive, and the fleet stops by itself when this
 * process is gone (INFERA_SIM_EXIT_WITH_PARENT: a SIGKILL runs no handler), so nothing is orphaned.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { envVar } from "../config/env-table.ts";
import { completeRecord } from "../discovery/static.ts";
import type { WorkerRecord } from "../discovery/types.ts";
import { probeRoutes } from "../engine/launcher/routes-probe.ts";
import type { FleetManifest } from "../engine/sim/fleet.ts";
import { stopChild } from "../util/child-process.ts";
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
  /** SIGTERM's grace period, seconds (as `infera server --drain-timeout`; default 30). */
  drainTimeoutS?: number;
  /** How long a model whose workers all left is answered 503 + Retry-After (`modelGoneRetryS`). */
  modelGoneRetryS?: number;
}

/** One engine of the fleet: a worker of the cluster. */
export interface SimChild {
  index: number;
  url: string;
  port: number;
  kvPort: number;
  replayPort: number;
  /** The fleet process (shared by every engine). */
  proc: ChildProcess;
  record?: WorkerRecord;
  exited: boolean;
}

export interface LocalCluster {
  server: InferaServer;
  /** The engines of the current fleet (replaced when a dead fleet is restarted). */
  sims: SimChild[];
  stop(): Promise<void>;
  /** Drains the server (like `infera server` on SIGTERM), then stops everything. */
  drain(graceMs: number): Promise<void>;
}

const SIM_BIN = fileURLToPath(new URL("../../bin/infera-sim.js", import.meta.url));
const BLOCK_SIZE = 16;
const TOPIC = "kv-events";

function portOf(endpoint: string | null | undefined): number {
  const m = /:(\d+)$/.exec(endpoint ?? "");
  return m ? Number(m[1]) : 0;
}

function spawnFleet(o: UpOptions, manifestFile: string) {
  const kvConfig = {
    enable_kv_cache_events: true,
    publisher: "zmq",
    // `*`: every engine binds a free port; the manifest names them.
    endpoint: "tcp://127.0.0.1:*",
    replay_endpoint: "tcp://127.0.0.1:*",
    topic: TOPIC,
  };
  const args = [
    SIM_BIN,
    "--fleet",
    String(o.workers),
    "--fleet-manifest",
    manifestFile,
    "serve",
    o.model,
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--served-model-name",
    o.model,
    "--block-size",
    String(BLOCK_SIZE),
    "--kv-events-config",
    JSON.stringify(kvConfig),
    ...(o.speed !== undefined ? ["--speed", String(o.speed)] : []),
    ...o.simArgs,
  ];
  const proc = spawn(process.execPath, args, {
    stdio: ["ignore", "ignore", "pipe"],
    env: {
      ...process.env,
      INFERA_LOG_LEVEL: envVar("INFERA_LOG_LEVEL") ?? "warn",
      // Our exit handler cannot run when we are SIGKILLed: the fleet then stops by itself.
      INFERA_SIM_EXIT_WITH_PARENT: "1",
    },
  });
  let tail = "";
  proc.stderr?.on("data", (c: Buffer) => {
    tail = (tail + c.toString("utf8")).slice(-4000);
  });
  return { proc, stderrTail: () => tail };
}

/** Waits for the fleet's manifest (written by rename once every engine is up). */
async function waitManifest(
  proc: ChildProcess,
  file: string,
  timeoutMs: number,
  stderrTail: () => string,
): Promise<FleetManifest> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null || proc.signalCode !== null)
      throw new Error(`the sim fleet exited during start-up:\n${stderrTail()}`);
    if (existsSync(file)) return JSON.parse(readFileSync(file, "utf8")) as FleetManifest;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`the sim fleet did not come up within ${timeoutMs} ms:\n${stderrTail()}`);
}

/** Restart backoff of a fleet that died: doubles from 1 s to 30 s, reset after a minute up. */
const RESTART_FIRST_MS = 1000;
const RESTART_MAX_MS = 30_000;
const RESTART_RESET_AFTER_MS = 60_000;

export async function startLocalCluster(o: UpOptions): Promise<LocalCluster> {
  if (!Number.isInteger(o.workers) || o.workers < 1)
    throw new Error(`--workers must be ≥ 1, got ${o.workers}`);
  const progress = o.progress ?? ((l: string) => process.stderr.write(`${l}\n`));
  const server = await upServer(o);
  const memory = server.memory!;
  const sims: SimChild[] = [];
  const dir = mkdtempSync(join(tmpdir(), "infera-up-"));
  let proc: ChildProcess | null = null;
  let exited = false;
  let stopped: Promise<void> | null = null;
  let restartTimer: NodeJS.Timeout | null = null;
  let backoffMs = RESTART_FIRST_MS;
  let restarts = 0;
  const onExit = () => {
    if (proc && !exited) proc.kill("SIGKILL");
  };
  process.on("exit", onExit);

  const stop = (): Promise<void> => {
    stopped ??= (async () => {
      if (restartTimer) clearTimeout(restartTimer);
      for (const s of sims) if (s.record) memory.remove(s.record.id);
      if (proc && !exited) await stopChild(proc);
      rmSync(dir, { recursive: true, force: true });
      await server.close();
      process.off("exit", onExit);
    })();
    return stopped;
  };

  /** Spawns the fleet, waits for its manifest and adds its engines to discovery. */
  const launch = async (): Promise<void> => {
    const file = join(dir, `fleet-${restarts}.json`);
    const fleet = spawnFleet(o, file);
    const child = fleet.proc;
    proc = child;
    exited = false;
    const startedAt = Date.now();
    child.once("exit", (code, signal) => {
      exited = true;
      for (const s of sims) s.exited = true;
      if (stopped) return;
      const n = sims.filter((s) => s.record).length;
      for (const s of sims) if (s.record) memory.remove(s.record.id);
      if (n === 0) return; // died during start-up: launch() reports it
      // A local cluster tool keeps its workers running: restart the fleet, with backoff.
      if (Date.now() - startedAt > RESTART_RESET_AFTER_MS) backoffMs = RESTART_FIRST_MS;
      const wait = backoffMs;
      backoffMs = Math.min(RESTART_MAX_MS, backoffMs * 2);
      progress(
        `  sim fleet (pid ${child.pid}) exited (${signal ?? code}); its ${n} workers removed; restarting in ${wait} ms`,
      );
      restartTimer = setTimeout(() => {
        restartTimer = null;
        if (stopped) return;
        restarts++;
        launch().then(
          () => progress(`  sim fleet restarted (restart ${restarts}, pid ${proc?.pid})`),
          (err: Error) => {
            // A fleet that died starting schedules the next try from its exit (the old
            // workers still count there); one that hangs is killed to the same end.
            progress(`  sim fleet restart failed: ${err.message.split("\n")[0]}`);
            if (!stopped && proc && !exited) proc.kill("SIGKILL");
          },
        );
      }, wait);
      restartTimer.unref?.();
    });
    const manifest = await waitManifest(child, file, 60_000 + 500 * o.workers, fleet.stderrTail);
    // The fleet's engines are one binary with one command line: what the first serves, all do.
    const first = manifest.engines[0];
    const routes = first ? await probeRoutes(first.url) : [];
    sims.length = 0;
    const every = o.workers <= 16 ? 1 : 16;
    for (const e of manifest.engines) {
      const sim = simChildOf(e, o.model, child, manifest.pid, routes);
      memory.put(sim.record);
      sims.push(sim);
      const ready = sims.length;
      if (ready % every === 0 || ready === o.workers)
        progress(`  worker ${ready}/${o.workers} ready: ${sim.url} (pid ${manifest.pid})`);
    }
  };

  try {
    progress(`infera up: server on ${server.url}; starting ${o.workers} sim worker(s) for '${o.model}'…`);
    await launch();
  } catch (err) {
    await stop();
    throw err;
  }
  /** SIGTERM: the server drains first (the workers still answer what is in flight), then all stops. */
  const drain = async (graceMs: number): Promise<void> => {
    if (restartTimer) clearTimeout(restartTimer);
    await server.drain(graceMs);
    await stop();
  };
  return { server, sims, stop, drain };
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
  // Like `infera server`: SIGTERM drains (streams in flight finish within the grace period),
  // SIGINT (Ctrl-C) stops at once; a second SIGINT exits.
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) {
      if (sig === "SIGINT") process.exit(1);
      return;
    }
    stopping = true;
    const drain = sig === "SIGTERM";
    process.stderr.write(`\ninfera up: ${sig}, ${drain ? "draining" : "stopping"}…\n`);
    (drain ? cluster.drain((o.drainTimeoutS ?? 30) * 1000) : cluster.stop()).then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
}

/** One engine of the fleet's manifest as a worker: its ports and its discovery record. */
function simChildOf(
  e: FleetManifest["engines"][number],
  model: string,
  child: ChildProcess,
  pid: number,
  routes: readonly string[],
): SimChild & { record: WorkerRecord } {
  const kv = e.kvRanks[0];
  return {
    index: e.index,
    url: e.url,
    port: e.port,
    kvPort: portOf(kv?.endpoint),
    replayPort: portOf(kv?.replayEndpoint),
    proc: child,
    exited: false,
    record: completeRecord({
      id: `sim-${e.index}@127.0.0.1:${e.port}`,
      url: e.url,
      model,
      servedModelNames: [model],
      engine: "sim",
      role: "mixed",
      blockSize: BLOCK_SIZE,
      ...(kv
        ? {
            kvEvents: {
              endpoint: kv.endpoint,
              ...(kv.replayEndpoint ? { replayEndpoint: kv.replayEndpoint } : {}),
              topic: TOPIC,
              framing: "seq" as const,
            },
          }
        : {}),
      labels: { pid: String(pid) },
      ...(routes.length > 0 ? { routes: [...routes] } : {}),
    }),
  };
}

/** The server in front of the local fleet: in-memory discovery, the fleet's engines added to it. */
function upServer(o: UpOptions): Promise<InferaServer> {
  return startServer({
    host: o.host,
    port: o.port,
    policy: o.policy,
    apiKeys: [...o.apiKeys],
    discovery: { kind: "memory" },
    ...(o.modelGoneRetryS !== undefined ? { modelGoneRetryS: o.modelGoneRetryS } : {}),
  });
}
