/**
 * Server configuration: defaults < config file (YAML/JSON, `--config`) < environment
 * (`INFERA_*`, src/config/env-table.ts) < command-line flags. Each layer is validated on its own
 * against the zod schema (./config-schema.ts), so an error names the layer and the key
 * (`--config x.yaml: port: ...`, `env INFERA_PORT: ...`, `--port: ...`); then the layers merge
 * field by field (nested objects too, arrays replace) and the result is validated once more.
 * The CLI passes only the flags the user gave, so defaults never mask the file or environment.
 *
 * Over 400 lines on purpose: a config key is added here (the interface and its default, side
 * by side) and its layering rules sit below, so one file answers "where does this value come
 * from". The schema (./config-schema.ts) and the printing (./config-print.ts) are already out.
 */
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { ENV_TABLE, type EnvVarSpec, envVar } from "../config/env-table.ts";
import type { DiscoveryConfig } from "../discovery/index.ts";
import type { RouterMode } from "../router/auto.ts";
import type { FlowConfigLayer } from "../router/flow/config-schema.ts";
import type { ProfilesConfig } from "../router/pipeline/config-schema.ts";
import type { BreakerOptions } from "../router/worker-set.ts";
import type { HttpExecutorOptions } from "../transport/http.ts";
import type { NatsConnectOptions } from "../transport/nats/connection.ts";
import type { HttpFront } from "./config-schema.ts";
import {
  ConfigError,
  type DisaggConfig,
  describeIssues,
  formatPath,
  type IngestConfig,
  type LayerSource,
  type PeersConfig,
  parseLayer,
  serverConfigLayerSchema,
} from "./config-schema.ts";

export {
  ConfigError,
  type DisaggConfig,
  type IngestConfig,
  type LayerSource,
  type PeersConfig,
} from "./config-schema.ts";

export type PolicyOptionValue = number | string | boolean;

export interface ServerConfig {
  host: string;
  /** 0 = any free port (tests). */
  port: number;
  discovery: DiscoveryConfig;
  /** The routing preset. */
  policy: string;
  /** The preset's knobs (the scheduler checks their names). */
  policyOptions: Record<string, PolicyOptionValue>;
  /** Per-step scheduling profiles (src/router/pipeline/config-schema.ts); absent = the preset's. */
  profiles?: ProfilesConfig;
  router: RouterMode;
  apiKeys: string[];
  /** Request bodies larger than this are refused with 413. */
  maxBodyBytes: number;
  /**
   * A client's whole request (headers and body) must arrive within this; a slower one gets 408
   * (Node's `requestTimeout`; 0 disables it).
   */
  requestTimeoutMs: number;
  /**
   * `raw`: the route table's plain requests are served straight off the socket
   * (src/server/front/), everything else by node:http; `node`: node:http serves all.
   */
  httpFront: HttpFront;
  /**
   * Non-streamed answers are held (to check them) up to this size; a larger one is relayed as
   * it arrives, unchecked, so a few huge answers cannot exhaust memory.
   */
  maxResponseBufferBytes: number;
  /** On SIGTERM: how long requests in flight may finish before the process exits. */
  drainTimeoutS: number;
  /**
   * Tokenizing time per request for routing (src/server/prompt-tokens.ts); past it, routing
   * scores the prompt's head it has. The prompt is otherwise read whole (up to 1 Mi characters).
   */
  promptBudgetMs: number;
  /** Token ids kept of recent prompts so a conversation's next turn tokenizes only its new text; 0 = off. */
  promptCacheTokens: number;
  /**
   * A model whose workers all left discovery within this many seconds is answered 503
   * `no_worker_available` with Retry-After (SDKs retry it), not 404 `model_not_found`. 0 = off.
   */
  modelGoneRetryS: number;
  /** Serve /metrics without an API key even when keys are set (it lists every worker's address). */
  metricsPublic: boolean;
  /** Model directory with tokenizer.json (+ chat template); the built-in BPE when absent. */
  tokenizer?: string;
  /** Engine `/metrics` scrape interval; 0 disables the scraper. */
  scrapeIntervalMs: number;
  /**
   * Scrape interval of a worker seen idle (nothing running or waiting, nothing in flight from this
   * server, the same load as last time); at most this long between its scrapes. 0 = always
   * `scrapeIntervalMs`.
   */
  scrapeIdleIntervalMs: number;
  /** OTLP/HTTP collector for request traces (src/server/tracing.ts); tracing is off when absent. */
  otlpEndpoint?: string;
  /** Retries on another worker after a connection failure before the first byte. */
  maxRetries: number;
  breaker: Partial<BreakerOptions>;
  upstream: HttpExecutorOptions;
  /** `http` (built in); other request planes plug in an executor. */
  requestPlane: string;
  /** KV events: `zmq` (each engine's socket) or `nats` (agents' relays); nats by default with `nats`. */
  eventPlane?: string;
  /** NATS connection (URL, auth, TLS) for the nats planes; with it both planes default to nats. */
  nats?: NatsConnectOptions;
  /** Prefill/decode disaggregation. */
  disagg: DisaggConfig;
  /** KV event ingestion. */
  ingest: IngestConfig;
  /** Routing state shared by server replicas (src/router/peers). */
  peers: PeersConfig;
  /** Flow control: admission queue, priority bands, tenant fairness and limits (src/router/flow). */
  flow?: FlowConfigLayer;
}

/** One layer: every key optional, nested objects partial. */
export type ServerConfigInput = Partial<
  Omit<
    ServerConfig,
    "discovery" | "nats" | "breaker" | "upstream" | "disagg" | "ingest" | "peers" | "policyOptions"
  >
> & {
  discovery?: Partial<DiscoveryConfig>;
  nats?: Partial<NatsConnectOptions>;
  breaker?: Partial<BreakerOptions>;
  upstream?: HttpExecutorOptions;
  disagg?: DisaggConfig;
  ingest?: IngestConfig;
  peers?: PeersConfig;
  policyOptions?: Readonly<Record<string, unknown>>;
};

export const defaultServerConfig: ServerConfig = {
  host: "127.0.0.1",
  port: 8000,
  discovery: { kind: "memory", prefix: "/infera" },
  policy: "round-robin",
  policyOptions: {},
  router: "auto",
  apiKeys: [],
  maxBodyBytes: 4 * 1024 * 1024,
  requestTimeoutMs: 60_000,
  httpFront: "raw",
  maxResponseBufferBytes: 16 * 1024 * 1024,
  drainTimeoutS: 30,
  promptBudgetMs: 100,
  promptCacheTokens: 4 * 1024 * 1024,
  modelGoneRetryS: 300,
  metricsPublic: false,
  scrapeIntervalMs: 2000,
  scrapeIdleIntervalMs: 20_000,
  maxRetries: 2,
  breaker: {},
  // A non-streamed answer's headers come only when it is complete, hence 10 minutes; a stream
  // may sit in the engine's queue before its first token, hence 5 minutes between chunks.
  upstream: { headersTimeoutMs: 600_000, bodyTimeoutMs: 300_000 },
  requestPlane: "http",
  disagg: {},
  ingest: {},
  peers: {},
};

export interface ConfigOptions {
  /** Where deprecation warnings go (the CLI: stderr); a pino logger by default. */
  warn?: (message: string) => void;
}

/** Node's own channel for deprecations: stderr, once per message, silenced by --no-deprecation. */
const defaultWarn = (m: string) => process.emitWarning(m, "DeprecationWarning");

/**
 * Knobs that used to ride in `policyOptions` and now have typed sections. A layer's
 * `policyOptions.<key>` still works (deprecated, with a warning) and lands in the section,
 * unless the same layer sets the section's key itself.
 */
export const POLICY_OPTION_ALIASES: Readonly<Record<string, "disagg" | "ingest">> = {
  prefillTimeoutMs: "disagg",
  decodeTimeoutMs: "disagg",
  pdFallbackMixed: "disagg",
  maxPrefillAttempts: "disagg",
  kvReplayTimeoutMs: "ingest",
  kvMaxBlocksPerWorker: "ingest",
};

/**
 * Policy options that no longer do anything: a layer's `policyOptions.<key>` is dropped with a
 * warning saying why. `trackPrefill`: whether prompt tokens count into a worker's pending
 * prefill follows the scheduling's needs (src/router/pipeline/build.ts), for mixed and PD alike.
 */
export const RETIRED_POLICY_OPTIONS: Readonly<Record<string, string>> = {
  trackPrefill: "the routing profiles' needs decide whether prompt tokens count as pending prefill",
};

const isPlain = (v: unknown): v is Record<string, unknown> =>
  v !== null &&
  typeof v === "object" &&
  !Array.isArray(v) &&
  (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null);

/**
 * Moves deprecated policyOptions keys into their sections (and drops retired ones); returns
 * old path → new path.
 */
function moveAliases(layer: Record<string, unknown>, src: LayerSource, warn: (m: string) => void) {
  const moved = new Map<string, string>();
  const po = layer.policyOptions;
  if (!isPlain(po)) return moved;
  const rest: Record<string, unknown> = { ...po };
  for (const [key, section] of Object.entries(POLICY_OPTION_ALIASES)) {
    if (!(key in rest)) continue;
    const value = rest[key];
    delete rest[key];
    const where = src.where?.(["policyOptions", key]) ?? `${src.label}: policyOptions.${key}`;
    const target = isPlain(layer[section]) ? { ...(layer[section] as Record<string, unknown>) } : {};
    if (target[key] === undefined) {
      target[key] = value;
      moved.set(`${section}.${key}`, `policyOptions.${key}`);
      warn(`${where} is deprecated; use ${section}.${key} (config file) instead`);
    } else {
      warn(`${where} is deprecated and ignored: ${section}.${key} is set too`);
    }
    layer[section] = target;
  }
  for (const [key, why] of Object.entries(RETIRED_POLICY_OPTIONS)) {
    if (!(key in rest)) continue;
    delete rest[key];
    const where = src.where?.(["policyOptions", key]) ?? `${src.label}: policyOptions.${key}`;
    warn(`${where} is deprecated and ignored: ${why}`);
  }
  layer.policyOptions = rest;
  return moved;
}

/**
 * Validates one layer (throws a ConfigError naming `src` and each bad key) and returns it
 * normalized: deprecated policy options moved into their sections.
 */
export function validateLayer(raw: unknown, src: LayerSource, o: ConfigOptions = {}): ServerConfigInput {
  if (raw === undefined || raw === null) return {};
  if (!isPlain(raw)) throw new ConfigError([`${src.label}: expected a mapping of config keys`]);
  const layer: Record<string, unknown> = { ...raw };
  const moved = moveAliases(layer, src, o.warn ?? defaultWarn);
  const aliasAware: LayerSource = {
    label: src.label,
    where: (path) => {
      const dotted = formatPath(path.slice(0, 2));
      const from = moved.get(dotted);
      const p = from ? ["policyOptions", ...path.slice(1)] : path;
      return src.where?.(p);
    },
  };
  parseLayer(layer, aliasAware);
  // Validation only: the layer keeps the caller's objects (records, say) rather than zod's copies.
  return layer as ServerConfigInput;
}

/** Layer value from a variable's text by its table type; text that does not parse stays text (the schema names it). */
function fromEnvText(spec: EnvVarSpec, raw: string): unknown {
  switch (spec.type) {
    case "integer":
    case "number": {
      const n = Number(raw);
      return raw.trim() === "" || Number.isNaN(n) ? raw : n;
    }
    case "boolean":
      if (/^(1|true|yes|on)$/i.test(raw)) return true;
      if (/^(0|false|no|off)$/i.test(raw)) return false;
      return raw;
    case "list":
      return raw
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
    default:
      return raw;
  }
}

function setPath(root: Record<string, unknown>, dotted: string, value: unknown): boolean {
  const keys = dotted.split(".");
  let cur = root;
  for (const k of keys.slice(0, -1)) {
    if (!isPlain(cur[k])) cur[k] = {};
    cur = cur[k] as Record<string, unknown>;
  }
  const last = keys[keys.length - 1]!;
  if (cur[last] !== undefined) return false;
  cur[last] = value;
  return true;
}

/** The `INFERA_*` environment layer with its source (errors name the variable: `env INFERA_PORT`). */
export function envLayer(env: NodeJS.ProcessEnv = process.env, o: ConfigOptions = {}): SourcedLayer {
  const layer: Record<string, unknown> = {};
  const used = new Map<string, string>(); // config key → the variable that set it
  for (const spec of ENV_TABLE) {
    if (!spec.configKey) continue;
    const raw = envVar(spec.name, env);
    if (raw === undefined) continue;
    if (setPath(layer, spec.configKey, fromEnvText(spec, raw))) used.set(spec.configKey, spec.name);
  }
  const source: LayerSource = {
    label: "env",
    where: (path) => {
      for (let n = path.length; n > 0; n--) {
        const name = used.get(path.slice(0, n).join("."));
        if (name) return `env ${name}`;
      }
      return undefined;
    },
  };
  return { layer: validateLayer(layer, source, o), source };
}

/** The `INFERA_*` environment layer, built from the variables table (src/config/env-table.ts). */
export function configFromEnv(
  env: NodeJS.ProcessEnv = process.env,
  o: ConfigOptions = {},
): ServerConfigInput {
  return envLayer(env, o).layer ?? {};
}

/** The config-file layer: YAML or JSON with the keys of ServerConfig. */
export function configFromFile(path: string, o: ConfigOptions = {}): ServerConfigInput {
  const label = `--config ${path}`;
  let doc: unknown;
  try {
    const text = readFileSync(path, "utf8");
    doc = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  } catch (e) {
    throw new ConfigError([`${label}: ${(e as Error).message}`]);
  }
  return validateLayer(doc, { label }, o);
}

function deepMerge(base: Record<string, unknown>, over: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(over)) {
    if (v === undefined) continue;
    const prev = out[k];
    out[k] = isPlain(v) ? deepMerge(isPlain(prev) ? prev : {}, v) : v;
  }
  return out;
}

/** A layer with the name to use in errors about it. */
export interface SourcedLayer {
  layer: ServerConfigInput | undefined;
  source: LayerSource;
}

function has(root: unknown, path: readonly (string | number)[]): boolean {
  let cur = root;
  for (const p of path) {
    if (cur === null || typeof cur !== "object") return false;
    cur = (cur as Record<string | number, unknown>)[p];
  }
  return cur !== undefined;
}

/**
 * Merges validated layers left to right (later wins) over the defaults, field by field at every
 * depth (so a `--nats-url` flag keeps the file's NATS credentials); arrays replace.
 */
export function mergeLayers(layers: readonly SourcedLayer[]): ServerConfig {
  let merged: Record<string, unknown> = deepMerge(
    {},
    defaultServerConfig as unknown as Record<string, unknown>,
  );
  for (const { layer } of layers) if (layer) merged = deepMerge(merged, layer as Record<string, unknown>);
  const cfg = merged as unknown as ServerConfig;
  // Workers given without a backend choice mean static discovery.
  const d = cfg.discovery;
  const explicitKind = layers.some((l) => l.layer?.discovery?.kind !== undefined);
  if (!explicitKind && ((d.workers?.length ?? 0) > 0 || d.workersFile))
    cfg.discovery = { ...d, kind: "static" };
  // NATS settings without a URL connect nowhere.
  if (cfg.nats && !cfg.nats.url) delete cfg.nats;
  // A NATS URL without plane choices means NATS for both (the production setup).
  if (cfg.nats?.url) {
    if (!layers.some((l) => l.layer?.requestPlane !== undefined)) cfg.requestPlane = "nats";
    if (!layers.some((l) => l.layer?.eventPlane !== undefined)) cfg.eventPlane = "nats";
  }
  // Once more as a whole: what only the merge shows (etcd options given in one layer, the kind
  // in another), each problem attributed to the last layer that set the key.
  const r = serverConfigLayerSchema.safeParse(cfg);
  if (!r.success) {
    const problems: string[] = [];
    for (const issue of r.error.issues) {
      const keyPaths =
        issue.code === "unrecognized_keys" ? issue.keys.map((k) => [...issue.path, k]) : [issue.path];
      for (const path of keyPaths) {
        const owner = [...layers].reverse().find((l) => has(l.layer, path));
        // The environment is shared by every command (a pod may hold etcd credentials whatever the
        // discovery backend), so a key it brings that this backend does not take is not an error.
        if (issue.code === "unrecognized_keys" && owner?.source.label === "env") continue;
        const src = owner?.source ?? { label: "config" };
        const one = issue.code === "unrecognized_keys" ? { ...issue, keys: [String(path.at(-1))] } : issue;
        problems.push(...describeIssues([one], owner?.layer ?? cfg, src));
      }
    }
    if (problems.length > 0) throw new ConfigError(problems);
  }
  return cfg;
}

/** Programmatic layers (startServer's input, tests): each validated as `config`, then merged. */
export function mergeConfig(...layers: (ServerConfigInput | undefined)[]): ServerConfig {
  return mergeLayers(
    layers.map((l, i) => {
      const source = { label: layers.length > 1 ? `config layer ${i + 1}` : "config" };
      return { layer: validateLayer(l, source), source };
    }),
  );
}

/**
 * File, then environment, then flags. `flags` may be a function building the flag layer (the
 * CLI's `flagsToConfig`), so that the problems of every layer are reported together.
 */
export function resolveServerConfig(
  flags: ServerConfigInput | (() => ServerConfigInput),
  configFile?: string,
  o: ConfigOptions & { env?: NodeJS.ProcessEnv; flagSource?: LayerSource } = {},
): ServerConfig {
  const flagSource = o.flagSource ?? { label: "flags" };
  const builders: (() => SourcedLayer)[] = [
    () => envLayer(o.env ?? process.env, o),
    () => ({
      layer: validateLayer(typeof flags === "function" ? flags() : flags, flagSource, o),
      source: flagSource,
    }),
  ];
  if (configFile)
    builders.unshift(() => ({
      layer: configFromFile(configFile, o),
      source: { label: `--config ${configFile}` },
    }));
  const layers: SourcedLayer[] = [];
  const problems: string[] = [];
  for (const build of builders) {
    try {
      layers.push(build());
    } catch (e) {
      if (!(e instanceof ConfigError)) throw e;
      problems.push(...e.problems);
    }
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return mergeLayers(layers);
}
