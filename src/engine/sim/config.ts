import type { ConnectorKind, WorkerRole } from "../../discovery/types.ts";
import type { EngineKind } from "./engine-flags.ts";
import type { SimProfile } from "./profile.ts";

export type { EngineKind };

/** vLLM's `--kv-events-config` (field names as vLLM spells them). */
export interface KvEventsConfig {
  enable_kv_cache_events: boolean;
  publisher: string;
  endpoint: string;
  replay_endpoint: string | null;
  topic: string;
  buffer_steps: number;
  hwm: number;
}

export type KvEventsEncoding = "array" | "map";
/** Frame layout: vLLM/SGLang `[topic, seq, payload]`, or ATOM's `[payload]` / `[topic, payload]`. */
export type KvEventsFraming = "seq" | "atom";

/** Everything the simulated engine needs; produced by the CLI parser or given programmatically. */
export interface SimConfig {
  /** The engine whose surface the sim presents (`--engine`; default vllm). */
  engine: EngineKind;
  /**
   * Set when `--engine` was named: the KV PUB socket follows the engine's bind-or-connect
   * heuristic (kvPubMode). Unset (the sim's long-standing command line): always bind.
   */
  engineExplicit?: boolean;
  model: string;
  servedModelNames: string[];
  host: string;
  port: number;
  blockSize: number;
  numGpuBlocks: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
  role: WorkerRole;
  connector: ConnectorKind;
  kvEvents: KvEventsConfig | null;
  kvEventsEncoding: KvEventsEncoding;
  kvEventsFraming: KvEventsFraming;
  kvTransferConfig: Record<string, unknown>;
  tokenizerDir?: string;
  /** vLLM's `--otlp-traces-endpoint`: export a span per request (./tracing.ts). */
  otlpTracesEndpoint?: string;
  speed: number;
  seed: number;
  profile: SimProfile;
  tpSize: number;
  dpSize: number;
  dpRank: number;
  /**
   * True: this process serves all `dpSize` ranks (the engine's internal DP: one frontend, one
   * scheduler + pool + KV publisher per rank). False: vLLM's `--data-parallel-rank` given, this
   * process is that one rank (external DP load balancing).
   */
  dpLocal: boolean;
  enablePrefixCaching: boolean;
  /** vLLM `--api-key`: when set, /v1 routes require `Authorization: Bearer <key>`. */
  apiKey?: string;
  /** How long a prefill worker holds blocks for D's pull. */
  holdTimeoutMs: number;
  /** vLLM `--stream-interval`: tokens per streamed event (1 = every token). */
  streamInterval: number;
  /** vLLM `--max-logprobs`: the most logprob alternatives a request may ask for. */
  maxLogprobs: number;
  /** `--tool-call-parser` (vLLM, SGLang): the server parses tool calls out of the model's text. */
  toolCallParser?: string;
  /** vLLM `--enable-auto-tool-choice`: tool_choice "auto" is served. */
  enableAutoToolChoice?: boolean;
  /** vLLM `--scheduling-policy fcfs|priority`: under priority, requests may carry `priority`. */
  schedulingPolicy?: "fcfs" | "priority";
}

export function defaultKvEventsConfig(): KvEventsConfig {
  return {
    enable_kv_cache_events: false,
    publisher: "null",
    endpoint: "tcp://*:5557",
    replay_endpoint: null,
    topic: "",
    buffer_steps: 10000,
    hwm: 100000,
  };
}

/**
 * Parses vLLM's `--kv-events-config` JSON. An object without `enable_kv_cache_events`
 * (SGLang's form) counts as enabled; `publisher` defaults to "zmq" then.
 */
export function parseKvEventsConfig(json: string | Record<string, unknown>): KvEventsConfig | null {
  const raw = typeof json === "string" ? (JSON.parse(json) as unknown) : json;
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new Error("--kv-events-config must be a JSON object");
  }
  const o = raw as Record<string, unknown>;
  const cfg = defaultKvEventsConfig();
  const enabled = o.enable_kv_cache_events === undefined ? true : o.enable_kv_cache_events === true;
  cfg.enable_kv_cache_events = enabled;
  cfg.publisher = typeof o.publisher === "string" ? o.publisher : "zmq";
  if (typeof o.endpoint === "string") cfg.endpoint = o.endpoint;
  if (typeof o.replay_endpoint === "string") cfg.replay_endpoint = o.replay_endpoint;
  if (typeof o.topic === "string") cfg.topic = o.topic;
  if (typeof o.buffer_steps === "number") cfg.buffer_steps = o.buffer_steps;
  if (typeof o.hwm === "number") cfg.hwm = o.hwm;
  if (!cfg.enable_kv_cache_events || cfg.publisher === "null") return null;
  if (cfg.publisher !== "zmq") throw new Error(`kv events publisher ${cfg.publisher} is not supported (zmq)`);
  return cfg;
}

/** Adds `offset` to the TCP port of a ZMQ endpoint (vLLM offsets by data-parallel rank). */
export function offsetEndpointPort(endpoint: string, offset: number): string {
  if (offset === 0) return endpoint;
  const m = /^(tcp:\/\/.*:)(\d+)$/.exec(endpoint);
  if (!m) return endpoint;
  return `${m[1]}${Number(m[2]) + offset}`;
}

/** Derives role and connector from vLLM's `--kv-transfer-config`, for flags not given. */
export function deriveFromKvTransfer(cfg: Record<string, unknown>): {
  role?: WorkerRole;
  connector?: ConnectorKind;
} {
  const out: { role?: WorkerRole; connector?: ConnectorKind } = {};
  const name = typeof cfg.kv_connector === "string" ? cfg.kv_connector.toLowerCase() : "";
  if (name.includes("nixl")) out.connector = "nixl";
  else if (name.includes("moriio") || name === "mori") out.connector = "moriio";
  else if (name.includes("mooncake")) out.connector = "mooncake";
  else if (name.includes("sglang")) out.connector = "sglang";
  else if (name.includes("atom")) out.connector = "atom";
  const role = cfg.kv_role;
  if (role === "kv_producer") out.role = "prefill";
  else if (role === "kv_consumer") out.role = "decode";
  return out;
}

/**
 * CPU blocks of vLLM's native KV offloading (`--kv-transfer-config '{"kv_connector":
 * "OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"num_cpu_blocks":N}}'`),
 * 0 when not configured. The sim then offloads every block it caches to a CPU LRU of N blocks and
 * reports it as vLLM's connector does (./block-pool.ts).
 */
/**
 * GPU blocks per offloaded block: the extra config's `block_size` (the offloaded block size,
 * default the GPU block size) over the GPU block size. vLLM asserts it is a multiple
 * (vllm/v1/kv_offload/spec.py OffloadingSpec.__init__), so a start with another one fails.
 */
export function offloadBlockFactor(cfg: Record<string, unknown>, gpuBlockSize: number): number {
  const extra = cfg.kv_connector_extra_config;
  const size = extra && typeof extra === "object" ? (extra as Record<string, unknown>).block_size : undefined;
  if (size === undefined || size === null) return 1;
  const n = Number(size);
  if (!Number.isInteger(n) || n <= 0 || n % gpuBlockSize !== 0)
    throw new Error(
      `AssertionError: kv_connector_extra_config.block_size ${String(size)} is not a multiple of the GPU block size ${gpuBlockSize}`,
    );
  return n / gpuBlockSize;
}

export function offloadCpuBlocks(cfg: Record<string, unknown>): number {
  if (cfg.kv_connector !== "OffloadingConnector") return 0;
  const extra = cfg.kv_connector_extra_config;
  const n =
    extra && typeof extra === "object" ? (extra as Record<string, unknown>).num_cpu_blocks : undefined;
  return typeof n === "number" && Number.isInteger(n) && n > 0 ? n : 0;
}

/**
 * Whether a ZMQ publisher binds `endpoint` rather than connecting to it: wildcards (`*`, `::`),
 * ipc:// and inproc://, plus `0.0.0.0` where the engine counts it (SGLang). Each personality's
 * kvPubMode cites its engine's rule.
 */
export function zmqBindsFor(endpoint: string, anyIpv4IsWildcard: boolean): boolean {
  return (
    endpoint.includes("*") ||
    endpoint.includes("::") ||
    endpoint.startsWith("ipc://") ||
    endpoint.startsWith("inproc://") ||
    (anyIpv4IsWildcard && endpoint.includes("0.0.0.0"))
  );
}
