/**
 * What a launcher knows about the engine it starts, after flag parsing and validation
 * (`LaunchSpec`), and the seam each engine module implements (`EngineAdapter`): build the
 * real command line + environment, and describe the connector for the worker record.
 */
import type { ConnectorInfo, EngineKind, KvEventsInfo, WorkerRole } from "../../discovery/types.ts";

/** KV transfer backends a launcher can configure (the engines' own names; "sglang"/"atom" are the sim's protocol names). */
export type TransferBackend = "none" | "nixl" | "mooncake" | "moriio" | "mori" | "sglang" | "atom";

export interface KvEventsSpec {
  enabled: boolean;
  /** Rank 0's PUB port; vLLM and SGLang bind rank r's on port + r. */
  port: number;
  /** Rank 0's vLLM/SGLang replay ROUTER port; rank r's is replayPort + r. */
  replayPort: number;
  topic: string;
}

export interface LaunchSpec {
  engine: EngineKind;
  workerId: string;
  model: string;
  /** As given; empty means "the model name". */
  servedModelNames: string[];
  /** Address the engine binds (its `--host`). */
  host: string;
  port: number;
  /** Address other machines use to reach this engine (record URL, KV events, bootstrap). */
  advertiseHost: string;
  /** True when the advertised host was stated (flag or INFERA_ADVERTISE_HOST), not guessed. */
  advertiseHostGiven: boolean;
  role: WorkerRole;
  backend: TransferBackend;
  tp?: number;
  dp?: number;
  quantization?: string;
  kvCacheDtype?: string;
  blockSize?: number;
  maxModelLen?: number;
  kvEvents: KvEventsSpec;
  /** Mooncake / SGLang bootstrap port (8998). */
  bootstrapPort: number;
  /** Nixl side-channel port (5600). */
  sideChannelPort: number;
  /** MoRIIO / ATOM handshake port (6301). */
  handshakePort: number;
  /** MoRIIO notify port (61005). */
  notifyPort: number;
  /** MoRIIO proxy the worker pings (`host:port`): the infera server's MoRIIO registration socket. */
  moriioProxy?: { host: string; port: number };
  /** MoRIIO transfer mode: READ (decode pulls; `read_mode: true`) or WRITE (vLLM's default). */
  moriioMode: "read" | "write";
  /** SGLang `--disaggregation-ib-device`. */
  ibDevice?: string;
  /** RoCEv2 GID index → MC_GID_INDEX / NCCL_IB_GID_INDEX / MORI_IB_GID_INDEX / UCX_IB_GID_INDEX. */
  gidIndex?: number;
  /** Replaces the engine's executable (words of a command, e.g. ["node", "bin/infera-sim.js"]). */
  engineBin?: string[];
  /** `--sim`: the simulator runs in this engine's personality with this engine's command line. */
  sim: boolean;
  /** OTLP traces URL (`--otlp-endpoint` with `/v1/traces`): the engine's own tracing flags. */
  otlpTracesUrl?: string;
  /** Everything after `--`, appended untouched. */
  extraArgs: string[];
}

export interface EngineCommand {
  argv: string[];
  /** Variables the launcher sets on top of its own environment. */
  env: Record<string, string>;
}

export interface EngineAdapter {
  readonly kind: EngineKind;
  /** The executable words used when `--engine-bin` is not given. */
  defaultBin(): string[];
  /** Backends this engine accepts, and the one a prefill/decode role gets by default. */
  readonly backends: readonly TransferBackend[];
  readonly defaultPdBackend: TransferBackend;
  readonly defaultBlockSize: number;
  /** Throws a BadRequestError for combinations the engine cannot run. */
  validate(spec: LaunchSpec): void;
  build(spec: LaunchSpec): EngineCommand;
  connector(spec: LaunchSpec): ConnectorInfo;
  kvEvents(spec: LaunchSpec): KvEventsInfo | undefined;
}
