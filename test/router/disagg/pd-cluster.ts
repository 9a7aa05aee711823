/**
 * Test fixture: xPyD sims speaking one connector, and a real `infera server --discovery
 * static --workers-file F` child process in front of them, with the official openai client.
 * The workers file holds partial records with role and connector (host/ports), as an
 * operator would write it.
 */

import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import OpenAI, { APIError } from "openai";
import * as zmq from "zeromq";
import type { PartialWorkerRecord } from "../../../src/discovery/static.ts";
import type { ConnectorInfo, ConnectorKind } from "../../../src/discovery/types.ts";
import { stopChild } from "../../../src/util/child-process.ts";
import { serverArgs } from "../../helpers/infera.ts";
import { freePort, retryOnPortRace } from "../../helpers/ports.ts";
import { spawnTracked } from "../../helpers/procs.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

export type PdKind = Exclude<ConnectorKind, "none">;

export interface PdWorker {
  sim: SimProcess;
  role: "prefill" | "decode";
  record: PartialWorkerRecord;
}

export interface PdCluster {
  url: string;
  client: OpenAI;
  prefills: PdWorker[];
  decodes: PdWorker[];
  server: ChildProcess;
  serverOutput(): string;
  /** Server and sim output, for failure messages. */
  dump(): string;
  close(): Promise<void>;
}

export interface PdClusterOptions {
  kind: PdKind;
  prefills?: number;
  decodes?: number;
  /** Extra sim flags for every worker (default `--speed 20`). */
  simArgs?: string[];
  prefillArgs?: string[];
  decodeArgs?: string[];
  /** Extra `infera server` flags. */
  serverArgs?: string[];
  /** Extra kv_connector_extra_config for D (e.g. sim_pull_timeout_ms). */
  decodeExtra?: Record<string, unknown>;
  /** MoRIIO transfer mode (default READ: `read_mode: true`). */
  moriioMode?: "READ" | "WRITE";
}

/** Where MoRIIO workers send their registration pings (a ROUTER the cluster owns). */
interface MoriioProxy {
  port: number;
  /** Registrations received so far (msgpack maps, undecoded). */
  count(): number;
}

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
const BIN = join(ROOT, "bin/infera.js");
export const MODEL = "sim-model";

/** The connector config a worker of `kind` and `role` is launched with, and what its record says. */
async function connectorSetup(
  o: PdClusterOptions,
  role: "prefill" | "decode",
  extra: Record<string, unknown>,
  httpPort: number,
  proxy: MoriioProxy | null,
): Promise<{ cfg: Record<string, unknown>; info: ConnectorInfo }> {
  const kind = o.kind;
  const host = "127.0.0.1";
  switch (kind) {
    case "nixl": {
      const port = await freePort();
      return {
        cfg: {
          kv_connector: "NixlConnector",
          kv_role: "kv_both",
          kv_connector_extra_config: { side_channel_port: port, ...extra },
        },
        info: { kind, bootstrapHost: host, bootstrapPort: port },
      };
    }
    case "mooncake": {
      const port = await freePort();
      return {
        cfg: {
          kv_connector: "MooncakeConnector",
          kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
          kv_connector_extra_config: { bootstrap_port: port, ...extra },
        },
        info: { kind, bootstrapHost: host, bootstrapPort: port },
      };
    }
    case "moriio": {
      const [hs, nt] = [await freePort(), await freePort()];
      const mode = o.moriioMode ?? "READ";
      return {
        cfg: {
          kv_connector: "MoRIIOConnector",
          kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
          // MoRIIOConfig.from_vllm_config reads proxy_ip, proxy_ping_port and http_port with
          // no default (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/moriio/
          // moriio_common.py @ 42fa4c096d406754b7e5c6d93835fe390487c8af): a worker without
          // them does not start. read_mode picks READ; WRITE is the default.
          kv_connector_extra_config: {
            proxy_ip: host,
            proxy_ping_port: proxy?.port ?? 0,
            http_port: httpPort,
            handshake_port: hs,
            notify_port: nt,
            read_mode: mode === "READ",
            ...extra,
          },
        },
        info: { kind, bootstrapHost: host, handshakePort: hs, notifyPort: nt, transferMode: mode },
      };
    }
    case "sglang": {
      const port = await freePort();
      return {
        cfg: { kv_connector: "sglang", bootstrap_port: port, kv_connector_extra_config: extra },
        info: { kind, bootstrapHost: host, bootstrapPort: port },
      };
    }
    case "atom": {
      const port = await freePort();
      return {
        cfg: {
          kv_connector: "moriio",
          kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
          handshake_port: port,
          kv_connector_extra_config: extra,
        },
        info: { kind, bootstrapHost: host, handshakePort: port },
      };
    }
  }
}

/** A worker on fresh ports, retried when a port picked for it was taken meanwhile. */
function startWorker(
  o: PdClusterOptions,
  role: "prefill" | "decode",
  i: number,
  proxy: MoriioProxy | null,
): Promise<PdWorker> {
  return retryOnPortRace(() => startWorkerOnce(o, role, i, proxy));
}

async function startWorkerOnce(
  o: PdClusterOptions,
  role: "prefill" | "decode",
  i: number,
  proxy: MoriioProxy | null,
): Promise<PdWorker> {
  const port = await freePort();
  const extra = role === "decode" ? (o.decodeExtra ?? {}) : {};
  const { cfg, info } = await connectorSetup(o, role, extra, port, proxy);
  const sim = await startSim({
    model: MODEL,
    port,
    timeoutMs: 60_000,
    args: [
      "--role",
      role,
      "--connector",
      o.kind,
      "--kv-transfer-config",
      JSON.stringify(cfg),
      "--seed",
      String(i + 1),
      ...(o.simArgs ?? ["--speed", "20"]),
      ...((role === "prefill" ? o.prefillArgs : o.decodeArgs) ?? []),
    ],
  });
  const record: PartialWorkerRecord = {
    id: `${role}-${i}`,
    url: sim.url,
    model: MODEL,
    servedModelNames: [MODEL],
    engine: "sim",
    role,
    connector: info,
    blockSize: 16,
    maxModelLen: 8192,
    // startSim enables the sim's ZMQ KV events; kv-aware routing of P uses them.
    kvEvents: {
      endpoint: sim.kvEndpoint,
      replayEndpoint: sim.replayEndpoint,
      topic: "kv-events",
      framing: "seq",
    },
  };
  return { sim, role, record };
}

/**
 * A ROUTER for MoRIIO's registration pings (vLLM's `_ping` is a DEALER to the proxy's
 * ROUTER). This cluster finds its workers through the workers file, so it only counts them.
 */
async function startMoriioProxy(): Promise<{ proxy: MoriioProxy; close(): void }> {
  const sock = new zmq.Router({ linger: 0 });
  await sock.bind("tcp://127.0.0.1:*");
  const ep = sock.lastEndpoint ?? "";
  let n = 0;
  void (async () => {
    try {
      for await (const _ of sock) n++;
    } catch {
      // closed
    }
  })();
  return {
    proxy: { port: Number(ep.slice(ep.lastIndexOf(":") + 1)), count: () => n },
    close: () => sock.close(),
  };
}

export async function startPdCluster(o: PdClusterOptions): Promise<PdCluster> {
  const nP = o.prefills ?? 1;
  const nD = o.decodes ?? 1;
  const moriio = o.kind === "moriio" ? await startMoriioProxy() : null;
  const proxy = moriio?.proxy ?? null;
  const started = await Promise.allSettled([
    ...Array.from({ length: nP }, (_, i) => startWorker(o, "prefill", i, proxy)),
    ...Array.from({ length: nD }, (_, i) => startWorker(o, "decode", i, proxy)),
  ]);
  const failed = started.find((r) => r.status === "rejected");
  if (failed) {
    // Stop the workers that did start: left running, they keep this test process alive.
    await Promise.all(started.map((r) => (r.status === "fulfilled" ? r.value.sim.stop() : undefined)));
    moriio?.close();
    throw (failed as PromiseRejectedResult).reason;
  }
  const workers = started.map((r) => (r as PromiseFulfilledResult<PdWorker>).value);
  const prefills = workers.slice(0, nP);
  const decodes = workers.slice(nP);
  const dir = mkdtempSync(join(tmpdir(), "infera-pd-"));
  const file = join(dir, "workers.json");
  writeFileSync(file, JSON.stringify([...prefills, ...decodes].map((w) => w.record)));
  const port = await freePort();
  const server = spawnTracked(
    process.execPath,
    [
      BIN,
      ...serverArgs(port),
      "--discovery",
      "static",
      "--workers-file",
      file,
      "--scrape-interval",
      "0",
      ...(o.serverArgs ?? []),
    ],
    { cwd: ROOT, env: { ...process.env, INFERA_LOG_LEVEL: "warn" }, stdio: ["ignore", "pipe", "pipe"] },
  );
  let out = "";
  const keep = (b: Buffer) => {
    out = (out + b.toString()).slice(-20000);
  };
  server.stdout?.on("data", keep);
  server.stderr?.on("data", keep);
  const url = `http://127.0.0.1:${port}`;
  const stopAll = async () => {
    await stopChild(server);
    await Promise.all([...prefills, ...decodes].map((w) => w.sim.stop()));
    moriio?.close();
    rmSync(dir, { recursive: true, force: true });
  };
  // Generous: the test machine is shared and often heavily loaded.
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (server.exitCode !== null) {
      await stopAll();
      throw new Error(`infera server exited: ${out}`);
    }
    try {
      const r = await fetch(`${url}/ready`, { signal: AbortSignal.timeout(2000) });
      if (r.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stopAll();
      throw new Error(`infera server not ready: ${out}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url,
    client: new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0 }),
    prefills,
    decodes,
    server,
    serverOutput: () => out,
    dump: () =>
      [
        `server: ${out.slice(-4000)}`,
        ...[...prefills, ...decodes].map((w) => `${w.record.id}: ${w.sim.output().slice(-4000)}`),
      ].join("\n"),
    close: stopAll,
  };
}

export interface PromptSources {
  local: number;
  external: number;
  hit: number;
}

/** vllm:prompt_tokens_by_source_total of one sim. */
export async function promptSources(sim: SimProcess): Promise<PromptSources> {
  const m = await sim.metrics();
  const get = (source: string) => parseMetric(m, "vllm:prompt_tokens_by_source_total", { source }) ?? 0;
  return { local: get("local_compute"), external: get("external_kv_transfer"), hit: get("local_cache_hit") };
}

export async function metric(sim: SimProcess, name: string, labels: Record<string, string> = {}) {
  return parseMetric(await sim.metrics(), name, labels) ?? 0;
}

export async function waitFor(pred: () => Promise<boolean>, ms = 5000, what = "condition"): Promise<void> {
  const end = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** A long-ish prompt unique per `tag` (so prefix caches do not hide recomputation). */
export function longPrompt(tag: string, repeat = 10): string {
  return `[${tag}] ${"Disaggregated serving moves the prompt's KV from the prefill worker to the decode worker. ".repeat(repeat)}`;
}

/** A cluster that lives for one test (stopped in its `after`, so the machine is not crowded). */
export async function clusterFor(t: TestContext, o: PdClusterOptions): Promise<PdCluster> {
  const c = await startPdCluster(o);
  t.after(() => c.close());
  return c;
}

/** A short chat request with a long, tagged prompt. */
export function ask(c: PdCluster, tag: string, maxTokens = 5, repeat = 10) {
  return c.client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: longPrompt(tag, repeat) }],
    max_tokens: maxTokens,
  });
}

/** The APIError a request must fail with. */
export async function apiError(p: Promise<unknown>): Promise<APIError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof APIError, String(err));
    return err;
  }
  assert.fail("expected an error answer");
}
