/**
 * vLLM-style command line for the simulated engine: `[serve] [MODEL] [--flag value | --flag=value]...`.
 * Flags the sim does not model are accepted and ignored (with a debug log), and unknown
 * flags with a warning, so that a launcher can start the sim in vLLM's place.
 */
import type { ConnectorKind, WorkerRole } from "../../discovery/types.ts";
import {
  deriveFromKvTransfer,
  type KvEventsEncoding,
  parseKvEventsConfig,
  type SimConfig,
} from "./config.ts";
import { loadProfile } from "./profile.ts";

export interface ParsedArgs {
  config: SimConfig;
  help: boolean;
  /** Flags accepted but not modelled. */
  ignored: string[];
  /** Flags not recognised at all. */
  unknown: string[];
}

const VALUE_FLAGS = new Set([
  "model",
  "host",
  "port",
  "block-size",
  "num-gpu-blocks",
  "num-gpu-blocks-override",
  "max-num-seqs",
  "max-num-batched-tokens",
  "max-model-len",
  "role",
  "connector",
  "kv-events-config",
  "kv-events-encoding",
  "kv-transfer-config",
  "tokenizer",
  "speed",
  "seed",
  "profile",
  "tensor-parallel-size",
  "data-parallel-size",
  "data-parallel-rank",
  "api-key",
  "kv-hold-timeout-ms",
  "stream-interval",
  "max-logprobs",
  "io-uring",
  "kv-events-framing",
]);

/** vLLM flags that take a value and that the sim accepts without modelling them. */
const IGNORED_VALUE_FLAGS = new Set([
  "gpu-memory-utilization",
  "kv-cache-dtype",
  "quantization",
  "dtype",
  "swap-space",
  "cpu-offload-gb",
  "load-format",
  "download-dir",
  "revision",
  "tokenizer-mode",
  "tokenizer-revision",
  "chat-template",
  "generation-config",
  "override-generation-config",
  "compilation-config",
  "speculative-config",
  "pipeline-parallel-size",
  "distributed-executor-backend",
  "data-parallel-address",
  "data-parallel-rpc-port",
  "data-parallel-size-local",
  "data-parallel-start-rank",
  "uvicorn-log-level",
  "max-num-partial-prefills",
  "long-prefill-token-threshold",
  "max-seq-len-to-capture",
  "scheduling-policy",
  "limit-mm-per-prompt",
  "hf-overrides",
  "worker-cls",
  "reasoning-parser",
  "tool-call-parser",
  "root-path",
  "allowed-origins",
  "middleware",
  "served-model-name-prefix",
  "prefix-caching-hash-algo",
  "kv-offloading-size",
  "kv-offloading-backend",
]);

const IGNORED_BOOL_FLAGS = new Set([
  "trust-remote-code",
  "disable-log-requests",
  "disable-log-stats",
  "enable-log-requests",
  "enable-chunked-prefill",
  "no-enable-chunked-prefill",
  "enforce-eager",
  "enable-expert-parallel",
  "async-scheduling",
  "headless",
  "disable-custom-all-reduce",
  "enable-auto-tool-choice",
  "disable-frontend-multiprocessing",
  "enable-prompt-tokens-details",
  "enable-force-include-usage",
  "disable-fastapi-docs",
  "enable-server-load-tracking",
  "skip-tokenizer-init",
]);

const SHORT_ALIASES: Record<string, string> = {
  tp: "tensor-parallel-size",
  dp: "data-parallel-size",
  pp: "pipeline-parallel-size",
  q: "quantization",
};

const ROLES: readonly WorkerRole[] = ["mixed", "prefill", "decode"];
const CONNECTORS: readonly ConnectorKind[] = ["nixl", "mooncake", "moriio", "sglang", "atom", "none"];

function toInt(flag: string, v: string, min: number): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new Error(`--${flag} must be an integer >= ${min} (got ${v})`);
  return n;
}

function parseJsonObject(flag: string, v: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(v);
  } catch (err) {
    throw new Error(`--${flag} is not valid JSON: ${(err as Error).message}`);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new Error(`--${flag} must be a JSON object`);
  }
  return parsed as Record<string, unknown>;
}

export function parseSimArgs(argv: readonly string[]): ParsedArgs {
  const values = new Map<string, string>();
  const served: string[] = [];
  const positionals: string[] = [];
  const ignored: string[] = [];
  const unknown: string[] = [];
  let help = false;
  let prefixCaching = true;

  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--help" || arg === "-h") {
      help = true;
      continue;
    }
    if (!arg.startsWith("-") || arg === "-") {
      positionals.push(arg);
      continue;
    }
    let name = arg.replace(/^--?/, "");
    let inline: string | undefined;
    const eq = name.indexOf("=");
    if (eq >= 0) {
      inline = name.slice(eq + 1);
      name = name.slice(0, eq);
    }
    name = name.replaceAll("_", "-");
    name = SHORT_ALIASES[name] ?? name;
    const next = (): string => {
      if (inline !== undefined) return inline;
      const v = argv[i + 1];
      if (v === undefined) throw new Error(`--${name} needs a value`);
      i++;
      return v;
    };
    if (name === "served-model-name") {
      if (inline !== undefined) served.push(inline);
      else while (i + 1 < argv.length && !argv[i + 1].startsWith("-")) served.push(argv[++i]);
      continue;
    }
    if (name === "enable-prefix-caching") {
      prefixCaching = true;
      continue;
    }
    if (name === "no-enable-prefix-caching") {
      prefixCaching = false;
      continue;
    }
    if (VALUE_FLAGS.has(name)) {
      values.set(name, next());
      continue;
    }
    if (IGNORED_VALUE_FLAGS.has(name)) {
      ignored.push(`--${name}=${next()}`);
      continue;
    }
    if (IGNORED_BOOL_FLAGS.has(name)) {
      ignored.push(`--${name}`);
      continue;
    }
    // Unknown: `--x=v` carries its value; `--x v` swallows a following non-flag word.
    const haveModel = values.has("model") || positionals.some((p) => p !== "serve");
    if (inline === undefined && i + 1 < argv.length && !argv[i + 1].startsWith("-") && haveModel) {
      unknown.push(`--${name} ${argv[++i]}`);
    } else unknown.push(inline === undefined ? `--${name}` : `--${name}=${inline}`);
  }

  if (positionals[0] === "serve") positionals.shift();
  const model = values.get("model") ?? positionals[0] ?? "sim-model";
  const profile = loadProfile(values.get("profile"));
  const kvTransferConfig = values.has("kv-transfer-config")
    ? parseJsonObject("kv-transfer-config", values.get("kv-transfer-config")!)
    : {};
  const derived = deriveFromKvTransfer(kvTransferConfig);

  const roleFlag = values.get("role");
  if (roleFlag !== undefined && !ROLES.includes(roleFlag as WorkerRole)) {
    throw new Error(`--role must be one of ${ROLES.join("|")}`);
  }
  const connectorFlag = values.get("connector");
  if (connectorFlag !== undefined && !CONNECTORS.includes(connectorFlag as ConnectorKind)) {
    throw new Error(`--connector must be one of ${CONNECTORS.join("|")}`);
  }
  const encoding = values.get("kv-events-encoding") ?? "array";
  if (encoding !== "array" && encoding !== "map") throw new Error("--kv-events-encoding must be array|map");

  const framing = values.get("kv-events-framing") ?? "seq";
  if (framing !== "seq" && framing !== "atom") throw new Error("--kv-events-framing must be seq|atom");
  const int = (flag: string, dflt: number, min = 1): number => {
    const v = values.get(flag);
    return v === undefined ? dflt : toInt(flag, v, min);
  };
  const speedRaw = values.get("speed");
  const speed = speedRaw === undefined ? 1 : Number(speedRaw);
  if (!Number.isFinite(speed) || speed <= 0) throw new Error("--speed must be a positive number");

  const ioUring = values.get("io-uring") ?? "auto";
  if (ioUring !== "auto" && ioUring !== "on" && ioUring !== "off")
    throw new Error("--io-uring must be auto|on|off");
  const kvEventsRaw = values.get("kv-events-config");
  const config: SimConfig = {
    model,
    servedModelNames: served.length > 0 ? served : [model],
    host: values.get("host") ?? "0.0.0.0",
    port: int("port", 8000, 0),
    blockSize: int("block-size", 16),
    numGpuBlocks: int("num-gpu-blocks", int("num-gpu-blocks-override", profile.num_gpu_blocks)),
    maxNumSeqs: int("max-num-seqs", profile.max_num_seqs),
    maxNumBatchedTokens: int("max-num-batched-tokens", profile.max_num_batched_tokens),
    maxModelLen: int("max-model-len", profile.max_model_len),
    role: (roleFlag as WorkerRole | undefined) ?? derived.role ?? "mixed",
    connector: (connectorFlag as ConnectorKind | undefined) ?? derived.connector ?? "none",
    kvEvents: kvEventsRaw === undefined ? null : parseKvEventsConfig(kvEventsRaw),
    kvEventsEncoding: encoding as KvEventsEncoding,
    kvEventsFraming: framing,
    kvTransferConfig,
    tokenizerDir: values.get("tokenizer"),
    speed,
    seed: int("seed", 0, 0),
    profile,
    tpSize: int("tensor-parallel-size", 1),
    dpSize: int("data-parallel-size", 1),
    dpRank: int("data-parallel-rank", 0, 0),
    enablePrefixCaching: prefixCaching,
    apiKey: values.get("api-key") ?? process.env.VLLM_API_KEY,
    holdTimeoutMs: int("kv-hold-timeout-ms", 120000),
    streamInterval: int("stream-interval", 1),
    maxLogprobs: int("max-logprobs", 20, 0),
    ioUring,
  };
  return { config, help, ignored, unknown };
}

export const SIM_HELP = `usage: infera-sim [serve] [MODEL] [options]

A simulated vLLM-compatible engine (OpenAI API, /metrics, KV events, PD connectors).

  --model M                     model name (or the positional MODEL); default sim-model
  --served-model-name N [N...]  names clients may use (default: the model)
  --host H / --port P           listen address (default 0.0.0.0:8000)
  --block-size N                KV block size in tokens (16)
  --num-gpu-blocks N            KV blocks in the pool (alias --num-gpu-blocks-override)
  --max-num-seqs N              running sequences per step
  --max-num-batched-tokens N    token budget per step (chunked prefill)
  --max-model-len N             prompt + output limit
  --role mixed|prefill|decode   PD role (default from --kv-transfer-config kv_role, else mixed)
  --connector nixl|mooncake|moriio|sglang|atom
  --kv-events-config JSON       vLLM's KV events config (zmq publisher, endpoint, replay_endpoint, topic, buffer_steps, hwm)
  --kv-events-encoding array|map  event layout: positional arrays (default) or maps with "type"
  --kv-events-framing seq|atom  [topic, seq, payload] (vLLM/SGLang, default) or ATOM's [payload] / [topic, payload]
  --kv-transfer-config JSON     vLLM's KV transfer config (kv_connector, kv_role, kv_connector_extra_config)
  --tokenizer DIR               HF model dir (tokenizer.json + tokenizer_config.json); default o200k BPE
  --speed X                     simulated time runs X times faster (1)
  --seed N                      output seed (0)
  --profile FILE                timing-model profile JSON (default: Llama-3.1-8B bf16 on MI355X)
  -tp/--tensor-parallel-size, -dp/--data-parallel-size, --data-parallel-rank
  --api-key KEY                 require this bearer token on /v1 routes
  --stream-interval N           tokens per streamed event, as vLLM's flag (1)
  --max-logprobs N              most logprob alternatives a request may ask for (20)
  --kv-hold-timeout-ms N        how long a prefill worker holds blocks for the decode pull (120000)
  --io-uring auto|on|off        send each tick's SSE events for all streams in one io_uring call (auto)
Other vLLM flags are accepted and ignored.`;
