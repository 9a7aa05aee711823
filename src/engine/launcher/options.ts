/**
 * Turns the launcher's flags into a validated `LaunchSpec`: defaults for the engines' well
 * known ports, the advertised host, a worker id, connector defaults per engine and role,
 * per-DP-rank KV-event ports that cannot collide, `--sim`, and `--gid-index auto` through
 * show_gids.
 */

import { randomUUID } from "node:crypto";
import { hostname, networkInterfaces } from "node:os";
import { envVar } from "../../config/env-table.ts";
import type { EngineKind, WorkerRole } from "../../discovery/types.ts";
import { BadRequestError } from "../../protocol/errors.ts";
import { maskUrlUserinfo, urlHasPassword } from "../../util/mask.ts";
import { otlpTracesUrl } from "../../util/otlp-url.ts";
import { splitCommand } from "./common.ts";
import { detectGidIndex } from "./gid.ts";
import { engineAdapters } from "./index.ts";
import { SIM_BIN } from "./sim.ts";
import type { LaunchSpec, TransferBackend } from "./types.ts";

/** Flag values as commander hands them over (strings unless noted). */
export interface LaunchFlags {
  model?: string;
  otlpEndpoint?: string;
  servedModelName?: string[];
  host?: string;
  port?: string;
  advertiseHost?: string;
  workerId?: string;
  role?: string;
  connector?: string;
  tp?: string;
  dp?: string;
  quantization?: string;
  kvCacheDtype?: string;
  blockSize?: string;
  maxModelLen?: string;
  kvEvents?: boolean;
  kvEventsPort?: string;
  kvEventsReplayPort?: string;
  kvEventsTopic?: string;
  bootstrapPort?: string;
  sideChannelPort?: string;
  handshakePort?: string;
  notifyPort?: string;
  moriioProxy?: string;
  moriioMode?: string;
  ibDevice?: string;
  gidIndex?: string;
  showGidsCmd?: string;
  engineBin?: string;
  sim?: boolean;
}

const ENGINES: readonly EngineKind[] = ["vllm", "sglang", "atom", "sim"];
const ROLES: readonly WorkerRole[] = ["mixed", "prefill", "decode"];
const BACKEND_ALIASES: Record<string, TransferBackend> = {
  none: "none",
  nixl: "nixl",
  mooncake: "mooncake",
  moriio: "moriio",
  mori: "mori",
  sglang: "sglang",
  atom: "atom",
};

export function parseEngineKind(v: string): EngineKind {
  if (!ENGINES.includes(v as EngineKind)) {
    throw new BadRequestError(`unknown engine '${v}' (use one of: ${ENGINES.join(", ")})`, "engine");
  }
  return v as EngineKind;
}

function int(flag: string, v: string | undefined, min: number, max = 1 << 30): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new BadRequestError(`--${flag} must be an integer in [${min}, ${max}] (got '${v}')`, flag);
  }
  return n;
}

const port = (flag: string, v: string | undefined, dflt: number): number => int(flag, v, 1, 65535) ?? dflt;

/** The first non-internal IPv4 address, else loopback. */
export function defaultAdvertiseHost(bindHost: string): string {
  if (bindHost !== "0.0.0.0" && bindHost !== "::" && bindHost !== "") return bindHost;
  for (const addrs of Object.values(networkInterfaces())) {
    for (const a of addrs ?? []) if (a.family === "IPv4" && !a.internal) return a.address;
  }
  return "127.0.0.1";
}

/** MoRI-IO is spelled "mori" by SGLang and "moriio" by vLLM/ATOM; accept either. */
function normalizeBackend(engine: EngineKind, v: TransferBackend): TransferBackend {
  if (engine === "sglang" && v === "moriio") return "mori";
  if ((engine === "vllm" || engine === "atom" || engine === "sim") && v === "mori") return "moriio";
  return v;
}

/**
 * The engine's traces URL. It goes on the engine's own command line (`--otlp-traces-endpoint`),
 * which every user of the host can read, so a URL with a password is refused: the engines'
 * Python OTLP exporter takes headers from OTEL_EXPORTER_OTLP_TRACES_HEADERS (or
 * OTEL_EXPORTER_OTLP_HEADERS) in its environment, which `infera engine` passes on.
 */
function engineOtlpUrl(endpoint: string | undefined): string | undefined {
  if (!endpoint) return undefined;
  if (urlHasPassword(endpoint))
    throw new BadRequestError(
      `--otlp-endpoint ${maskUrlUserinfo(endpoint)} carries a password, and the engine gets the URL ` +
        "on its command line, where any user of the host can read it: give the URL without it and " +
        "the credentials as a header in OTEL_EXPORTER_OTLP_TRACES_HEADERS " +
        "(e.g. Authorization=Basic%20<base64>), which the engine's exporter reads from its environment",
      "otlp-endpoint",
    );
  return otlpTracesUrl(endpoint);
}

export async function buildLaunchSpec(
  engine: EngineKind,
  flags: LaunchFlags,
  extraArgs: string[],
): Promise<LaunchSpec> {
  const adapter = engineAdapters[engine];
  if (!flags.model) throw new BadRequestError("--model is required", "model");
  const role = (flags.role ?? "mixed") as WorkerRole;
  if (!ROLES.includes(role)) throw new BadRequestError(`--role must be one of ${ROLES.join("|")}`, "role");
  let backend: TransferBackend;
  if (flags.connector === undefined) backend = role === "mixed" ? "none" : adapter.defaultPdBackend;
  else {
    const b = BACKEND_ALIASES[flags.connector.toLowerCase()];
    if (!b) throw new BadRequestError(`unknown --connector '${flags.connector}'`, "connector");
    backend = normalizeBackend(engine, b);
  }
  const host = flags.host ?? "0.0.0.0";
  const httpPort = port("port", flags.port, 8000);
  const proxy = flags.moriioProxy ?? envVar("INFERA_MORIIO_PROXY");
  const moriio = proxy ? parseHostPort(proxy, 36367) : undefined;
  const moriioMode = (flags.moriioMode ?? "read").toLowerCase();
  if (moriioMode !== "read" && moriioMode !== "write") {
    throw new BadRequestError(
      `--moriio-mode must be read or write (got '${flags.moriioMode}')`,
      "moriio-mode",
    );
  }
  const givenAdvertise = flags.advertiseHost ?? envVar("INFERA_ADVERTISE_HOST");
  const dp = int("dp", flags.dp, 1);
  const spec: LaunchSpec = {
    engine,
    workerId: flags.workerId ?? `${engine}-${hostname()}-${httpPort}-${randomUUID().slice(0, 8)}`,
    model: flags.model,
    servedModelNames: (flags.servedModelName ?? []).flatMap((n) => n.split(",")).filter((n) => n !== ""),
    host,
    port: httpPort,
    advertiseHost: givenAdvertise ?? defaultAdvertiseHost(host),
    advertiseHostGiven: givenAdvertise !== undefined,
    role,
    backend,
    tp: int("tp", flags.tp, 1),
    dp,
    quantization: flags.quantization,
    kvCacheDtype: flags.kvCacheDtype,
    blockSize: int("block-size", flags.blockSize, 1),
    maxModelLen: int("max-model-len", flags.maxModelLen, 1),
    kvEvents: kvEventPorts(flags, dp ?? 1),
    bootstrapPort: port("bootstrap-port", flags.bootstrapPort, 8998),
    sideChannelPort: port("side-channel-port", flags.sideChannelPort, 5600),
    handshakePort: port("handshake-port", flags.handshakePort, 6301),
    notifyPort: port("notify-port", flags.notifyPort, 61005),
    moriioProxy: moriio,
    moriioMode,
    ibDevice: flags.ibDevice,
    engineBin: flags.engineBin ? splitCommand(flags.engineBin) : undefined,
    sim: flags.sim === true,
    otlpTracesUrl: engineOtlpUrl(flags.otlpEndpoint),
    extraArgs,
  };
  if (spec.engineBin?.length === 0) throw new BadRequestError("--engine-bin is empty", "engine-bin");
  if (spec.sim) {
    if (engine === "sim")
      throw new BadRequestError("--sim is for vllm|sglang|atom ('sim' already is one)", "sim");
    if (spec.engineBin) throw new BadRequestError("--sim replaces the executable; drop --engine-bin", "sim");
    // The sim in this engine's personality, given exactly the real engine's arguments and env.
    spec.engineBin = [process.execPath, SIM_BIN, "--engine", engine];
  }
  if (flags.gidIndex === "auto") {
    const cmd = flags.showGidsCmd ?? envVar("INFERA_SHOW_GIDS_CMD") ?? "show_gids";
    spec.gidIndex = (await detectGidIndex(cmd, flags.ibDevice)).index;
  } else spec.gidIndex = int("gid-index", flags.gidIndex, 0, 255);
  adapter.validate(spec);
  return spec;
}

/**
 * KV-event ports. vLLM and SGLang bind rank r's PUB on port + r and its replay ROUTER on
 * replayPort + r, so the two ranges [port, port + dp) and [replayPort, replayPort + dp) must
 * not overlap: an unset replay port follows the PUB range (port + dp; 5558 at --dp 1), an
 * explicit one that overlaps is refused.
 */
function kvEventPorts(flags: LaunchFlags, dp: number): LaunchSpec["kvEvents"] {
  const pub = port("kv-events-port", flags.kvEventsPort, 5557);
  const replay = port("kv-events-replay-port", flags.kvEventsReplayPort, pub + dp);
  const enabled = flags.kvEvents !== false;
  if (enabled) {
    const last = Math.max(pub, replay) + dp - 1;
    if (last > 65535) {
      throw new BadRequestError(
        `--dp ${dp}: KV-event ports run past 65535 (rank r binds --kv-events-port + r and --kv-events-replay-port + r)`,
        "kv-events-port",
      );
    }
    if (replay < pub + dp && pub < replay + dp) {
      throw new BadRequestError(
        `KV-event ports collide: rank r binds PUB ${pub}+r and replay ${replay}+r for r < ${dp}; ` +
          `use --kv-events-replay-port >= ${pub + dp} or <= ${pub - dp}`,
        "kv-events-replay-port",
      );
    }
  }
  return { enabled, port: pub, replayPort: replay, topic: flags.kvEventsTopic ?? "kv-events" };
}

function parseHostPort(v: string, dfltPort: number): { host: string; port: number } {
  const i = v.lastIndexOf(":");
  if (i <= 0) return { host: v, port: dfltPort };
  return { host: v.slice(0, i), port: port("moriio-proxy", v.slice(i + 1), dfltPort) };
}
