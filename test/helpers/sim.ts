import type { ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { killChild, stopChild } from "../../src/util/child-process.ts";
import { freePort, retryOnPortRace } from "./ports.ts";
import { spawnTracked, startedOrStopped } from "./procs.ts";
import { mixedRecord } from "./records.ts";

/** A simulated engine running as a child process (`node bin/infera-sim.js [--engine K] ...`). */
export interface SimProcess {
  url: string;
  port: number;
  model: string;
  /** ZMQ PUB endpoint for KV events, e.g. tcp://127.0.0.1:40001. */
  kvEndpoint: string;
  /** ZMQ ROUTER replay endpoint. */
  replayEndpoint: string;
  pid: number;
  child: ChildProcess;
  /** Raw /metrics text. */
  metrics(): Promise<string>;
  /** SIGTERM, then wait for exit (SIGKILL after 5 s). */
  stop(): Promise<void>;
  kill(): void;
  /** stderr + stdout captured so far (for failure messages). */
  output(): string;
}

export interface StartSimOptions {
  args?: string[];
  env?: Record<string, string>;
  model?: string;
  /** Extra fields merged into the --kv-events-config JSON. */
  kvEvents?: Record<string, unknown>;
  /** Health wait limit (default 60 s: three sims starting at once on a loaded box took > 20 s). */
  timeoutMs?: number;
  /**
   * The sim's personality (default vllm). sglang: `--model-path`, `--port`, `--kv-events-config`;
   * atom: `--model`, `--server-port` and KV events through ATOM_KV_EVENTS_* (ATOM framing, no replay).
   */
  engine?: "vllm" | "sglang" | "atom";
  /** HTTP port (default: a free one); for configs that must name it, e.g. MoRIIO's http_port. */
  port?: number;
}

const BIN = fileURLToPath(new URL("../../bin/infera-sim.js", import.meta.url));
const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/**
 * Starts a sim on free ports. freePort() can race with other test processes (a port free a
 * moment ago gets taken before the sim binds it): such a start is retried on new ports.
 */
export function startSim(opts: StartSimOptions = {}): Promise<SimProcess> {
  return retryOnPortRace(() => startSimOnce(opts));
}

async function startSimOnce(opts: StartSimOptions): Promise<SimProcess> {
  const model = opts.model ?? "sim-model";
  const port = opts.port ?? (await freePort());
  const kvPort = await freePort();
  const replayPort = await freePort();
  const kvEndpoint = `tcp://127.0.0.1:${kvPort}`;
  const replayEndpoint = `tcp://127.0.0.1:${replayPort}`;
  const kvCfg = {
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: kvEndpoint,
    replay_endpoint: replayEndpoint,
    topic: "kv-events",
    ...opts.kvEvents,
  };
  const engine = opts.engine ?? "vllm";
  const personality: Record<typeof engine, string[]> = {
    vllm: [
      "serve",
      model,
      "--port",
      String(port),
      "--host",
      "127.0.0.1",
      "--kv-events-config",
      JSON.stringify(kvCfg),
    ],
    sglang: [
      "--engine",
      "sglang",
      "--model-path",
      model,
      "--port",
      String(port),
      "--host",
      "127.0.0.1",
      "--kv-events-config",
      JSON.stringify(kvCfg),
    ],
    atom: ["--engine", "atom", "--model", model, "--server-port", String(port), "--host", "127.0.0.1"],
  };
  // ROCm/ATOM atom/utils/envs.py: ATOM's KV events are configured by environment only.
  const atomEnv: Record<string, string> =
    engine === "atom"
      ? {
          ATOM_KV_EVENTS_ENABLE: "1",
          ATOM_KV_EVENTS_ENDPOINT: kvEndpoint,
          ATOM_KV_EVENTS_TOPIC: String(kvCfg.topic),
        }
      : {};
  const args = [BIN, ...personality[engine], ...(opts.args ?? [])];
  const child = spawnTracked(process.execPath, args, {
    cwd: ROOT,
    env: { ...process.env, INFERA_LOG_LEVEL: "warn", ...atomEnv, ...opts.env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const keep = (b: Buffer): void => {
    out += b.toString();
    if (out.length > 20000) out = out.slice(-20000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + (opts.timeoutMs ?? 60_000);
  await startedOrStopped(child, async () => {
    for (;;) {
      if (child.exitCode !== null) throw new Error(`infera-sim exited with ${child.exitCode}: ${out}`);
      try {
        // Per-attempt limit: a connection that is accepted but never answered (the port taken
        // by another process in a freePort race) must not hang start-up past its deadline.
        const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2000) });
        if (r.ok) return;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`infera-sim did not become healthy: ${out}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  });
  return {
    url,
    port,
    model,
    kvEndpoint,
    replayEndpoint,
    pid: child.pid!,
    child,
    async metrics() {
      const r = await fetch(`${url}/metrics`);
      return r.text();
    },
    stop: () => stopChild(child),
    kill: () => killChild(child),
    output: () => out,
  };
}

/**
 * The discovery record of a sim publishing KV events (seq framing, replay endpoint, topic
 * "kv-events") as a mixed worker, the way the KV routing tests register one.
 */
export function simWorkerRecord(
  sim: SimProcess,
  o: { id: string; model: string; maxModelLen: number; blockSize?: number },
): WorkerRecord {
  return mixedRecord({
    id: o.id,
    model: o.model,
    url: sim.url,
    blockSize: o.blockSize ?? 16,
    kvEvents: {
      endpoint: sim.kvEndpoint,
      replayEndpoint: sim.replayEndpoint,
      topic: "kv-events",
      framing: "seq",
    },
    maxModelLen: o.maxModelLen,
  });
}

/**
 * Value of one Prometheus sample: `name` exactly (e.g. "vllm:num_requests_running" or
 * "vllm:prompt_tokens_by_source_total") whose labels include all of `labels`; summed when
 * several series match.
 */
export function parseMetric(
  text: string,
  name: string,
  labels: Record<string, string> = {},
): number | undefined {
  let total: number | undefined;
  for (const line of text.split("\n")) {
    if (line.length === 0 || line.startsWith("#")) continue;
    const brace = line.indexOf("{");
    const space = line.lastIndexOf(" ");
    const metric = brace >= 0 && brace < space ? line.slice(0, brace) : line.slice(0, space);
    if (metric !== name) continue;
    const labelText = brace >= 0 && brace < space ? line.slice(brace + 1, line.lastIndexOf("}")) : "";
    const have: Record<string, string> = {};
    for (const m of labelText.matchAll(/([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) have[m[1]] = m[2];
    if (!Object.entries(labels).every(([k, v]) => have[k] === v)) continue;
    const v = Number(line.slice(space + 1));
    if (Number.isNaN(v)) continue;
    total = (total ?? 0) + v;
  }
  return total;
}

/**
 * Waits until a server receives this sim's KV events, instead of sleeping while its ZMQ SUB
 * "joins": a PUB drops what it sends before a subscriber's subscription has reached it (ZMQ's
 * slow joiner), and when the dropped batch is the last one, no later seq reveals the gap to the
 * server's replay, so the test waits for an index that never fills. No sleep is long enough on a
 * loaded box; this resends until received. Each round asks the sim for a completion of
 * `probeTokens` prompt tokens (full blocks: stored, so published) and polls `seen` (e.g. the
 * index holds a block of the worker, or the server's event count rose) for `roundMs`. Then the
 * sim's prefix cache is reset (vLLM's `POST /reset_prefix_cache`, published as
 * AllBlocksCleared), so the test starts from an empty cache on the sim and in the index; with
 * `reset: false` the probe's blocks stay (each round's prompt differs anyway, and a lost round
 * is recovered by the server's gap replay once a later one arrives), and nothing follows the
 * probe's batch. vLLM personality only (the route is vLLM's).
 */
export async function kvEventsReceived(
  sim: Pick<SimProcess, "url" | "model">,
  seen: () => boolean | Promise<boolean>,
  o: { timeoutMs?: number; roundMs?: number; what?: string; probeWords?: number; reset?: boolean } = {},
): Promise<void> {
  const timeoutMs = o.timeoutMs ?? 30_000;
  const roundMs = o.roundMs ?? 500;
  const t0 = Date.now();
  for (let round = 0; ; round++) {
    // A prompt the tests never send (its blocks are cleared below anyway).
    const prompt = Array.from({ length: o.probeWords ?? 64 }, (_, i) => `probe${round}x${i}`).join(" ");
    const r = await fetch(`${sim.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: sim.model, prompt, max_tokens: 1 }),
    });
    if (r.status !== 200) throw new Error(`kv probe: sim answered ${r.status}: ${await r.text()}`);
    await r.text();
    const until = Date.now() + roundMs;
    let ok = await seen();
    while (!ok && Date.now() < until) {
      await new Promise((res) => setTimeout(res, 10));
      ok = await seen();
    }
    if (o.reset !== false) {
      const reset = await fetch(`${sim.url}/reset_prefix_cache`, { method: "POST" });
      if (reset.status !== 200)
        throw new Error(`kv probe: reset answered ${reset.status}: ${await reset.text()}`);
      await reset.text();
    }
    if (ok) return;
    if (Date.now() - t0 > timeoutMs)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${o.what ?? "KV events"} from ${sim.url}`);
  }
}
