/**
 * The sim's command line: `[--engine vllm|sglang|atom] <the args the real engine gets>`.
 * Each personality parses its engine's own flag names (engine-flags.ts); sim-only tuning flags
 * are accepted everywhere. Flags an engine does not declare are refused as argparse refuses
 * them (ArgParseError → exit 2, `error: unrecognized arguments: ...`).
 */
import type { ConnectorKind, WorkerRole } from "../../discovery/types.ts";
import { ArgParseError, type RawArgs } from "./arg-types.ts";
import {
  deriveFromKvTransfer,
  type KvEventsEncoding,
  type KvEventsFraming,
  parseKvEventsConfig,
  type SimConfig,
} from "./config.ts";
import { ENGINE_KINDS, type EngineKind, type FlagSpec, SIM_FLAGS } from "./engine-flags.ts";
import { personalityOf } from "./personalities/index.ts";
import type { Personality } from "./personalities/types.ts";
import { loadProfile } from "./profile.ts";

export { ArgParseError };

export interface ParsedArgs {
  config: SimConfig;
  help: boolean;
  /** Flags accepted but not modelled. */
  ignored: string[];
  /** Always empty: unknown flags now fail (kept for callers that log it). */
  unknown: string[];
  /** `--fleet N` / `--fleet-manifest FILE` (fleet.ts): N engines in this process; absent: one. */
  fleet: { count: number; manifest: string | null } | null;
}

const ROLES: readonly WorkerRole[] = ["mixed", "prefill", "decode"];
const FRAMINGS: readonly KvEventsFraming[] = ["seq", "atom"];
const CONNECTORS: readonly ConnectorKind[] = ["nixl", "mooncake", "moriio", "sglang", "atom", "none"];

function toInt(flag: string, v: string, min: number, prog: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min)
    throw new ArgParseError(`argument --${flag}: invalid int value: '${v}' (must be >= ${min})`, prog);
  return n;
}

function parseJsonObject(flag: string, v: string, prog: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(v);
  } catch (err) {
    throw new ArgParseError(`argument --${flag}: invalid JSON: ${(err as Error).message}`, prog);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new ArgParseError(`argument --${flag}: must be a JSON object`, prog);
  }
  return parsed as Record<string, unknown>;
}

/** The personality named by `--engine K` / `--engine=K` (default vllm). */
function engineOf(argv: readonly string[]): EngineKind {
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = a === "--engine" ? argv[i + 1] : a.startsWith("--engine=") ? a.slice(9) : undefined;
    if (v === undefined) continue;
    if (!ENGINE_KINDS.includes(v as EngineKind))
      throw new ArgParseError(
        `argument --engine: invalid choice: '${v}' (choose from ${ENGINE_KINDS.join(", ")})`,
        "infera-sim",
      );
    return v as EngineKind;
  }
  return "vllm";
}

/** Looks a flag up: the engine's table first, then the sim's own; vLLM/ATOM accept `_` for `-`. */
function lookup(p: Personality, name: string): FlagSpec | undefined {
  const table = p.flags;
  const own = table[name] ?? SIM_FLAGS[name];
  if (own || !p.underscoreFlags || !name.startsWith("--")) return own;
  const dashed = `--${name.slice(2).replaceAll("_", "-")}`;
  const under = `--${name.slice(2).replaceAll("-", "_")}`;
  return table[dashed] ?? SIM_FLAGS[dashed] ?? table[under];
}

function scan(argv: readonly string[], p: Personality): RawArgs {
  const engine = p.kind;
  const prog = p.prog;
  const raw: RawArgs = {
    engine,
    prog,
    values: new Map(),
    multi: new Map(),
    bools: new Set(),
    positionals: [],
    ignored: [],
    help: false,
  };
  const unrecognized: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--help" || arg === "-h") {
      raw.help = true;
      continue;
    }
    if (!arg.startsWith("-") || arg === "-" || /^-\d/.test(arg)) {
      raw.positionals.push(arg);
      continue;
    }
    const eq = arg.indexOf("=");
    const name = eq >= 0 ? arg.slice(0, eq) : arg;
    const inline = eq >= 0 ? arg.slice(eq + 1) : undefined;
    const spec = lookup(p, name);
    if (!spec) {
      unrecognized.push(arg);
      // argparse leaves a following word unconsumed; it is unrecognized too (no positional takes it).
      if (inline === undefined && i + 1 < argv.length && !argv[i + 1].startsWith("-")) {
        const hasModel = p.positionalModel && raw.positionals.some((w) => w !== "serve");
        if (hasModel || !p.positionalModel) unrecognized.push(argv[++i]);
      }
      continue;
    }
    const takeValue = (): string => {
      if (inline !== undefined) return inline;
      const nxt = argv[i + 1];
      if (nxt === undefined || (nxt.startsWith("-") && !/^-\d/.test(nxt)))
        throw new ArgParseError(`argument ${name}: expected one argument`, prog);
      i++;
      return nxt;
    };
    switch (spec.arity) {
      case "bool":
        if (inline !== undefined)
          throw new ArgParseError(`argument ${name}: ignored explicit argument '${inline}'`, prog);
        if (spec.key) raw.bools.add(spec.key);
        else raw.ignored.push(name);
        break;
      case "optional": {
        let val = inline;
        if (val === undefined && i + 1 < argv.length && !argv[i + 1].startsWith("-")) val = argv[++i];
        raw.ignored.push(val === undefined ? name : `${name}=${val}`);
        break;
      }
      case "multi": {
        const words: string[] = [];
        if (inline !== undefined) words.push(inline);
        else while (i + 1 < argv.length && !argv[i + 1].startsWith("-")) words.push(argv[++i]);
        if (words.length === 0)
          throw new ArgParseError(`argument ${name}: expected at least one argument`, prog);
        if (spec.key) raw.multi.set(spec.key, words);
        break;
      }
      case "value": {
        const val = takeValue();
        if (spec.key) raw.values.set(spec.key, val);
        else raw.ignored.push(`${name}=${val}`);
        break;
      }
    }
  }
  // vLLM: `[serve] MODEL` positional; SGLang and ATOM take no positionals.
  if (p.positionalModel) {
    if (raw.positionals[0] === "serve") raw.positionals.shift();
    if (raw.positionals.length > 1) unrecognized.push(...raw.positionals.slice(1));
  } else unrecognized.push(...raw.positionals);
  if (unrecognized.length > 0)
    throw new ArgParseError(`unrecognized arguments: ${unrecognized.join(" ")}`, prog);
  return raw;
}

export function parseSimArgs(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): ParsedArgs {
  const p = personalityOf(engineOf(argv));
  const raw = scan(argv, p);
  const { values, prog, engine } = raw;
  const model = values.get("model") ?? (p.positionalModel ? raw.positionals[0] : undefined) ?? "sim-model";
  const profile = loadProfile(values.get("profile"));
  const kvTransferConfig = values.has("kv-transfer-config")
    ? parseJsonObject("kv-transfer-config", values.get("kv-transfer-config")!, prog)
    : {};
  const derived = deriveFromKvTransfer(kvTransferConfig);

  const roleFlag = values.get("role");
  if (roleFlag !== undefined && !ROLES.includes(roleFlag as WorkerRole)) {
    throw new ArgParseError(
      `argument --role: invalid choice: '${roleFlag}' (choose from ${ROLES.join(", ")})`,
      prog,
    );
  }
  const connectorFlag = values.get("connector");
  if (connectorFlag !== undefined && !CONNECTORS.includes(connectorFlag as ConnectorKind)) {
    throw new ArgParseError(
      `argument --connector: invalid choice: '${connectorFlag}' (choose from ${CONNECTORS.join(", ")})`,
      prog,
    );
  }
  const explicitEngine = argv.some((a) => a === "--engine" || a.startsWith("--engine="));
  const encoding = values.get("kv-events-encoding") ?? p.defaultKvEncoding(explicitEngine);
  if (encoding !== "array" && encoding !== "map")
    throw new ArgParseError("argument --kv-events-encoding: invalid choice (choose from array, map)", prog);
  const framing = values.get("kv-events-framing") ?? p.defaultKvFraming;
  if (!FRAMINGS.includes(framing as KvEventsFraming))
    throw new ArgParseError("argument --kv-events-framing: invalid choice (choose from seq, atom)", prog);
  const int = (flag: string, dflt: number, min = 1): number => {
    const v = values.get(flag);
    return v === undefined ? dflt : toInt(flag, v, min, prog);
  };
  const speedRaw = values.get("speed");
  const speed = speedRaw === undefined ? 1 : Number(speedRaw);
  if (!Number.isFinite(speed) || speed <= 0)
    throw new ArgParseError("argument --speed: must be a positive number", prog);

  const kvEventsRaw = values.get("kv-events-config");
  let kvEvents: SimConfig["kvEvents"] = null;
  try {
    kvEvents = kvEventsRaw === undefined ? null : parseKvEventsConfig(kvEventsRaw);
  } catch (err) {
    throw new ArgParseError(`argument --kv-events-config: ${(err as Error).message}`, prog);
  }
  const served =
    raw.multi.get("served-model-name") ??
    (values.has("served-model-name") ? [values.get("served-model-name")!] : []);
  const dpRankRaw = values.get("dp-rank");
  // vLLM SchedulerConfig.policy: Literal["fcfs", "priority"].
  const policy = values.get("scheduling-policy") ?? "fcfs";
  if (policy !== "fcfs" && policy !== "priority")
    throw new ArgParseError(
      `argument --scheduling-policy: invalid choice: '${policy}' (choose from 'fcfs', 'priority')`,
      prog,
    );
  const config: SimConfig = {
    engine,
    ...(explicitEngine ? { engineExplicit: true } : {}),
    model,
    servedModelNames: served.length > 0 ? served : [model],
    host: values.get("host") ?? p.defaultHost,
    port: int("port", p.defaultPort, 0),
    blockSize: int("block-size", p.defaultBlockSize),
    numGpuBlocks: int("num-gpu-blocks", profile.num_gpu_blocks),
    maxNumSeqs: int("max-num-seqs", profile.max_num_seqs),
    maxNumBatchedTokens: int("max-num-batched-tokens", profile.max_num_batched_tokens),
    maxModelLen: int("max-model-len", profile.max_model_len),
    role: (roleFlag as WorkerRole | undefined) ?? derived.role ?? "mixed",
    connector: (connectorFlag as ConnectorKind | undefined) ?? derived.connector ?? "none",
    kvEvents,
    kvEventsEncoding: encoding as KvEventsEncoding,
    kvEventsFraming: framing as KvEventsFraming,
    kvTransferConfig,
    tokenizerDir: values.get("tokenizer"),
    otlpTracesEndpoint: values.get("otlp-traces-endpoint"),
    speed,
    seed: int("seed", 0, 0),
    profile,
    tpSize: int("tp", 1),
    dpSize: int("dp", 1),
    dpRank: dpRankRaw === undefined ? 0 : toInt("data-parallel-rank", dpRankRaw, 0, prog),
    dpLocal: dpRankRaw === undefined,
    enablePrefixCaching: !raw.bools.has("prefix-caching-off"),
    apiKey: values.get("api-key") ?? (p.apiKeyEnv ? env[p.apiKeyEnv] : undefined),
    holdTimeoutMs: int("kv-hold-timeout-ms", 120000),
    streamInterval: int("stream-interval", 1),
    maxLogprobs: int("max-logprobs", 20, 0),
    ...(values.has("tool-call-parser") ? { toolCallParser: values.get("tool-call-parser") } : {}),
    ...(raw.bools.has("enable-auto-tool-choice") ? { enableAutoToolChoice: true } : {}),
    ...(policy === "priority" ? { schedulingPolicy: "priority" as const } : {}),
  };
  p.applyArgs(config, raw, env);
  const fleetManifest = values.get("fleet-manifest") ?? null;
  const fleet =
    values.has("fleet") || fleetManifest !== null
      ? { count: int("fleet", 1), manifest: fleetManifest }
      : null;
  return { config, help: raw.help, ignored: raw.ignored, unknown: [], fleet };
}

export const SIM_HELP = `usage: infera-sim [--engine vllm|sglang|atom] <the engine's own arguments>

A simulated LLM engine that presents vLLM's, SGLang's or ATOM's surface (command line,
OpenAI API and native routes, /metrics, KV events, PD connectors) without a GPU.

  --engine vllm     vLLM: [serve] MODEL --port P --served-model-name N... --kv-events-config JSON ...
  --engine sglang   SGLang launch_server: --model-path M --port P --tp-size N --dp-size N --page-size N
                    --disaggregation-mode prefill|decode --disaggregation-bootstrap-port P ...
  --engine atom     ATOM openai_server: --model M --server-port P -tp N -dp N --block-size N
                    --kv-transfer-config JSON; KV events from ATOM_KV_EVENTS_* env vars

Sim-only, in every personality:
  --speed X                     simulated time runs X times faster (1)
  --profile FILE                timing-model profile JSON (default: Llama-3.1-8B bf16 on MI355X)
  --seed N                      output seed (0)
  --num-gpu-blocks N            KV blocks in the pool
  --role mixed|prefill|decode   PD role (default from the engine's PD flags)
  --connector nixl|mooncake|moriio|sglang|atom
  --kv-events-encoding array|map  vLLM only: vLLM's newest maps (default with --engine vllm) or
                                positional arrays (default without --engine)
  --kv-events-framing seq|atom  override the frame layout
  --kv-hold-timeout-ms N        how long a prefill worker holds blocks for the decode pull (120000)
  --tokenizer-dir DIR           HF model dir for the tokenizer (vLLM's --tokenizer, SGLang's --tokenizer-path)
  --fleet N                     run N engines in this one process, each with its own ports, pool,
                                scheduler, metrics, KV events and PD side channels: engine i's HTTP
                                port is --port + i, its KV-event / replay / PD ports base + i x dp size
                                (port 0 and tcp://host:* stay "any free port")
  --fleet-manifest FILE         once all are up, write {pid, engines: [{index, url, port, kvRanks}]}
                                to FILE (atomically)
Flags the engine does not declare fail with exit 2, as argparse does.`;
