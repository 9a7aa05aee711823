/**
 * A fleet: N simulated engines in one process on one event loop (`infera-sim --fleet N`), in
 * the spirit of Dynamo's mocker and llm-d's inference-sim. Each engine is a whole
 * startWithConfig() engine: its own HTTP port, KV-event PUB/replay sockets, metrics registry,
 * PD connector and side channels, block pool(s) and scheduler(s), and its own engine id; only
 * what nothing writes to is shared (the tokenizer, the output vocabulary, the logprob model,
 * the parsed timing profile). Ports per engine: fleet-ports.ts. Idle engines run no timers.
 */
import { rename, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import * as zmq from "zeromq";
import { parseSimArgs } from "./args.ts";
import type { SimConfig } from "./config.ts";
import { fleetEngineConfig } from "./fleet-ports.ts";
import { type ConnectorFactory, type SimHandle, startWithConfig } from "./server.ts";

export interface SimFleetOptions {
  /** How many engines. */
  count: number;
  /** The engine's own command line (as `infera-sim` takes it); `--fleet*` flags are ignored. */
  argv?: readonly string[];
  /** A parsed config instead of `argv`. */
  config?: SimConfig;
  connectorFactory?: ConnectorFactory;
  /** Engines started at once (default 16): bounds the burst of binds and tokenizer work. */
  concurrency?: number;
  /** Called as engines come up (started so far, count). */
  onProgress?: (started: number, count: number) => void;
}

export interface SimFleet {
  /** Engine i at index i. */
  engines: SimHandle[];
  close(): Promise<void>;
}

/** `--fleet-manifest`'s JSON (the fleet contract in the README's "Fleet" section). */
export interface FleetManifest {
  pid: number;
  engines: {
    index: number;
    url: string;
    port: number;
    kvRanks: { rank: number; endpoint: string; replayEndpoint: string | null }[];
  }[];
}

/** One engine of the fleet could not start: the whole fleet is released. */
export class FleetStartError extends Error {
  readonly index: number;
  readonly port: number;
  constructor(index: number, port: number, detail: string, cause: unknown) {
    super(
      `fleet engine ${index} (HTTP port ${port === 0 ? "any" : port}${detail}) failed to start: ${
        (cause as Error)?.message ?? String(cause)
      }`,
    );
    this.name = "FleetStartError";
    this.index = index;
    this.port = port;
    this.cause = cause;
  }
}

function describePorts(cfg: SimConfig): string {
  const parts: string[] = [];
  if (cfg.kvEvents) {
    parts.push(`KV events ${cfg.kvEvents.endpoint}`);
    if (cfg.kvEvents.replay_endpoint) parts.push(`replay ${cfg.kvEvents.replay_endpoint}`);
  }
  if (cfg.connector !== "none") parts.push(`${cfg.connector} ${JSON.stringify(cfg.kvTransferConfig)}`);
  return parts.length > 0 ? `; ${parts.join("; ")}` : "";
}

/**
 * libzmq's context allows 1023 sockets by default (ZMQ_MAX_SOCKETS), two per engine rank here
 * (KV PUB + replay ROUTER) and more for some connectors: past ~500 engines the fleet would fail
 * with "Too many open file descriptors". libzmq reads the limit when the context creates its
 * first socket, so this takes effect when the fleet starts first in its process (the CLI).
 */
function raiseZmqSocketLimit(want: number): void {
  const ctx = zmq.context;
  const target = Math.min(ctx.maxSocketsLimit, want);
  if (ctx.maxSockets < target) ctx.maxSockets = target;
}

/** Starts `count` engines; any engine failing to start fails the fleet, with nothing left running. */
export async function startSimFleet(o: SimFleetOptions): Promise<SimFleet> {
  if (!Number.isInteger(o.count) || o.count < 1) throw new Error(`--fleet must be >= 1, got ${o.count}`);
  const base = o.config ?? parseSimArgs(o.argv ?? []).config;
  raiseZmqSocketLimit(o.count * (2 * base.dpSize + 2) + 256);
  const width = Math.max(1, o.concurrency ?? 16);
  const engines: SimHandle[] = new Array(o.count);
  const started: SimHandle[] = [];
  let failure: FleetStartError | null = null;
  for (let first = 0; first < o.count && !failure; first += width) {
    const batch = Array.from({ length: Math.min(width, o.count - first) }, (_, k) => first + k);
    await Promise.all(
      batch.map(async (i) => {
        const cfg = fleetEngineConfig(base, i);
        try {
          const h = await startWithConfig(cfg, o.connectorFactory, { fleetIndex: i });
          engines[i] = h;
          started.push(h);
        } catch (err) {
          failure ??= new FleetStartError(i, cfg.port, describePorts(cfg), err);
        }
      }),
    );
    if (!failure) o.onProgress?.(started.length, o.count);
  }
  const close = async (): Promise<void> => {
    await Promise.all(started.map((h) => h.close()));
  };
  if (failure) {
    await close();
    throw failure;
  }
  return { engines, close };
}

export function fleetManifest(fleet: SimFleet, pid: number = process.pid): FleetManifest {
  return {
    pid,
    engines: fleet.engines.map((h, index) => ({
      index,
      url: h.url,
      port: h.port,
      kvRanks: h.kvRanks,
    })),
  };
}

/** Writes the manifest atomically (a reader never sees half a file): tmp in the same dir + rename. */
export async function writeFleetManifest(file: string, manifest: FleetManifest): Promise<void> {
  const tmp = join(dirname(file), `.${process.pid}.${Date.now()}.fleet-manifest.tmp`);
  await writeFile(tmp, `${JSON.stringify(manifest, null, 2)}\n`);
  await rename(tmp, file);
}
