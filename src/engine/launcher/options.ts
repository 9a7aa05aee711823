/**
 * Turns the launcher's flags into a validated `LaunchSpec`: defaults for the engines' well
 * known ports, the advertised host, a worker id, connector defaults per engine and role,
 * and `--gid-index auto` through show_gids.
 */
import { randomUUID } from "node:crypto";
import { hostname, networkInterfaces } from "node:os";
import type { EngineKind, WorkerRole } from "../../discovery/types.ts";
import { BadRequestError } from "../../protocol/errors.ts";
import { splitCommand } from "./common.ts";
import { detectGidIndex } from "./gid.ts";
import { engineAdapters } from "./index.ts";
import type { LaunchSpec, TransferBackend } from "./types.ts";

/** Flag values as commander hands them over (strings unless noted). */
export interface LaunchFlags {
  model?: string;
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
  ibDevice?: string;
  gidIndex?: string;
  showGidsCmd?: string;
  engineBin?: string;
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
  const moriio = flags.moriioProxy ? parseHostPort(flags.moriioProxy, 36367) : undefined;
  const spec: LaunchSpec = {
    engine,
    workerId: flags.workerId ?? `${engine}-${hostname()}-${httpPort}-${randomUUID().slice(0, 8)}`,
    model: flags.model,
    servedModelNames: (flags.servedModelName ?? []).flatMap((n) => n.split(",")).filter((n) => n !== ""),
    host,
    port: httpPort,
    advertiseHost: flags.advertiseHost ?? process.env.INFERA_ADVERTISE_HOST ?? defaultAdvertiseHost(host),
    role,
    backend,
    tp: int("tp", flags.tp, 1),
    dp: int("dp", flags.dp, 1),
    quantization: flags.quantization,
    kvCacheDtype: flags.kvCacheDtype,
    blockSize: int("block-size", flags.blockSize, 1),
    maxModelLen: int("max-model-len", flags.maxModelLen, 1),
    kvEvents: {
      enabled: flags.kvEvents !== false,
      port: port("kv-events-port", flags.kvEventsPort, 5557),
      replayPort: port("kv-events-replay-port", flags.kvEventsReplayPort, 5558),
      topic: flags.kvEventsTopic ?? "kv-events",
    },
    bootstrapPort: port("bootstrap-port", flags.bootstrapPort, 8998),
    sideChannelPort: port("side-channel-port", flags.sideChannelPort, 5600),
    handshakePort: port("handshake-port", flags.handshakePort, 6301),
    notifyPort: port("notify-port", flags.notifyPort, 61005),
    moriioProxy: moriio,
    ibDevice: flags.ibDevice,
    engineBin: flags.engineBin ? splitCommand(flags.engineBin) : undefined,
    extraArgs,
  };
  if (spec.engineBin?.length === 0) throw new BadRequestError("--engine-bin is empty", "engine-bin");
  if (flags.gidIndex === "auto") {
    const cmd = flags.showGidsCmd ?? process.env.INFERA_SHOW_GIDS_CMD ?? "show_gids";
    spec.gidIndex = (await detectGidIndex(cmd, flags.ibDevice)).index;
  } else spec.gidIndex = int("gid-index", flags.gidIndex, 0, 255);
  adapter.validate(spec);
  return spec;
}

function parseHostPort(v: string, dfltPort: number): { host: string; port: number } {
  const i = v.lastIndexOf(":");
  if (i <= 0) return { host: v, port: dfltPort };
  return { host: v.slice(0, i), port: port("moriio-proxy", v.slice(i + 1), dfltPort) };
}
