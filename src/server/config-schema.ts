/**
 * The zod schema of the server config: one layer (the file, the environment, the flags, or a
 * programmatic input) is `serverConfigLayerSchema`, every key optional and every object strict,
 * so a typo'd key is refused rather than ignored. src/server/config.ts validates each layer
 * against it, naming the layer in the errors, then merges them.
 *
 * One documented exception to strictness: `discovery.options` of a backend this file does not
 * know (a plug-in's), whose options only that backend can check. etcd's and moriio's are strict.
 */
import { type ZodTypeAny, z } from "zod";
import { flowConfigSchema } from "../router/flow/config-schema.ts";
import { profilesConfigSchema } from "../router/pipeline/config-schema.ts";

const MAX = Number.MAX_SAFE_INTEGER;

/** A number field whose one message names what it is (errors read `port: expected an integer 0..65535 (port)`). */
function num(what: string, o: { int?: boolean; min?: number; max?: number; above?: number } = {}) {
  const kind = o.int ? "an integer" : "a number";
  const range =
    o.above !== undefined
      ? ` > ${o.above}`
      : o.max !== undefined && o.max < MAX
        ? ` ${o.min ?? 0}..${o.max}`
        : o.min !== undefined
          ? ` >= ${o.min}`
          : "";
  const message = `expected ${kind}${range} (${what})`;
  return z
    .number({ invalid_type_error: message, required_error: message })
    .refine(
      (n) =>
        (!o.int || Number.isInteger(n)) &&
        Number.isFinite(n) &&
        (o.min === undefined || n >= o.min) &&
        (o.max === undefined || n <= o.max) &&
        (o.above === undefined || n > o.above),
      message,
    );
}
const ms = (what: string) => num(what, { int: true, min: 0 });
const posInt = (what: string) => num(what, { int: true, min: 1 });
const str = (what: string) =>
  z
    .string({ invalid_type_error: `expected a string (${what})` })
    .min(1, `expected a non-empty string (${what})`);
const bool = (what: string) => z.boolean({ invalid_type_error: `expected true or false (${what})` });
const strList = (what: string) =>
  z.array(str(what), { invalid_type_error: `expected a list of strings (${what})` });

export const ROUTER_MODES = ["auto", "mixed", "disagg"] as const;
/** Who parses client requests (src/server/front/front.ts). */
export const HTTP_FRONTS = ["raw", "node"] as const;
export type HttpFront = (typeof HTTP_FRONTS)[number];
export const EVENT_PLANES = ["zmq", "nats"] as const;

/** etcd's `discovery.options` (src/discovery/etcd-watcher.ts createEtcdWatcherFromConfig). */
export const etcdDiscoveryOptionsSchema = z
  .object({
    username: str("etcd user"),
    password: z.string(),
    caFile: str("CA file"),
    certFile: str("client certificate file"),
    keyFile: str("client key file"),
    startTimeoutMs: ms("etcd start timeout"),
    startDegraded: bool("start while etcd is down"),
  })
  .partial()
  .strict();

/** moriio's `discovery.options` (src/discovery/moriio-proxy.ts createMoriioProxyDiscoveryFromConfig). */
export const moriioDiscoveryOptionsSchema = z
  .object({
    model: str("model name"),
    servedModelNames: strList("served model names"),
    host: str("proxy bind host"),
    port: num("proxy port", { int: true, min: 0, max: 65535 }),
    staleMs: posInt("stale time"),
    engine: str("engine kind"),
    blockSize: posInt("KV block size"),
    maxModelLen: posInt("max model length"),
  })
  .partial()
  .strict();

/** Options of the backends known here; any other kind's options are its own business. */
export const discoveryOptionSchemas: Readonly<Record<string, ZodTypeAny>> = {
  etcd: etcdDiscoveryOptionsSchema,
  moriio: moriioDiscoveryOptionsSchema,
  memory: z.object({}).strict(),
  static: z.object({}).strict(),
};

export const discoverySchema = z
  .object({
    kind: str("discovery backend"),
    workers: strList("worker URLs"),
    workersFile: str("workers file"),
    /** Partial worker records (programmatic, or in the file); StaticDiscovery checks each one. */
    records: z.array(z.record(z.string(), z.unknown())),
    etcdEndpoints: strList("etcd endpoints"),
    prefix: str("registry key prefix"),
    options: z.record(z.string(), z.unknown()),
  })
  .partial()
  .strict()
  .superRefine((d, ctx) => {
    if (!d.options || d.kind === undefined) return;
    const schema = discoveryOptionSchemas[d.kind];
    if (!schema) return;
    const r = schema.safeParse(d.options);
    if (!r.success) for (const i of r.error.issues) ctx.addIssue({ ...i, path: ["options", ...i.path] });
  });

export const natsSchema = z
  .object({
    url: str("NATS URL"),
    token: z.string(),
    user: str("NATS user"),
    password: z.string(),
    nkeySeed: z.string(),
    nkeySeedFile: str("nkey seed file"),
    tls: z
      .object({
        caFile: str("CA file"),
        certFile: str("client certificate file"),
        keyFile: str("client key file"),
        rejectUnauthorized: bool("verify the server certificate"),
      })
      .partial()
      .strict(),
    name: str("connection name"),
    reconnectTimeWaitMs: ms("NATS reconnect interval"),
    maxReconnectAttempts: num("NATS reconnect attempts", { int: true, min: -1 }),
    connectTimeoutMs: ms("NATS connect timeout"),
    reconnectWaitMs: ms("NATS reconnect wait"),
    allowAnonymous: bool("connect to NATS without auth, without the warning"),
  })
  .partial()
  .strict();

export const breakerSchema = z
  .object({
    failureThreshold: posInt("breaker failure threshold"),
    cooldownMs: ms("breaker cooldown"),
    maxCooldownMs: ms("breaker max cooldown"),
    probeTimeoutMs: ms("breaker probe timeout"),
  })
  .partial()
  .strict();

export const upstreamSchema = z
  .object({
    connections: posInt("connections per worker"),
    headersTimeoutMs: ms("upstream headers timeout"),
    bodyTimeoutMs: ms("upstream body timeout"),
    keepAliveTimeoutMs: ms("upstream keep-alive timeout"),
  })
  .partial()
  .strict();

/** Prefill/decode disaggregation (was `--policy-option prefillTimeoutMs=...` and the like). */
export const disaggSchema = z
  .object({
    /** Limit for P's half (to its answer). */
    prefillTimeoutMs: posInt("prefill timeout"),
    /** Limit for D's half (to its response headers). */
    decodeTimeoutMs: posInt("decode timeout"),
    /** When no prefill worker can serve, run the request on a decode worker as an ordinary one. */
    pdFallbackMixed: bool("PD fallback to mixed"),
    /** Prefill workers tried per request. */
    maxPrefillAttempts: posInt("prefill attempts"),
  })
  .partial()
  .strict();

/** KV event ingestion (was `--policy-option kvReplayTimeoutMs=...` / `kvMaxBlocksPerWorker=...`). */
export const ingestSchema = z
  .object({
    /**
     * How long a worker's event replay may go without a reply before the ingest gives up on it
     * (a stall timeout: a replay that keeps delivering lasts as long as the history; 2000).
     */
    kvReplayTimeoutMs: posInt("KV replay timeout"),
    /**
     * How long /ready answers 503 while some rank's start-up replay is still running (60000;
     * 0: never wait). A rank whose history cannot be had (`unknown`) never holds it.
     */
    readyWaitKvSyncMs: z.number().int().nonnegative(),
    /** Index cap per DP rank for workers whose record has no kvBlocks. */
    kvMaxBlocksPerWorker: posInt("KV blocks per worker"),
  })
  .partial()
  .strict();

/**
 * Routing state shared by server replicas (src/router/peers): with `--event-plane nats` on a
 * NATS subject, otherwise on a ZMQ PUB/SUB mesh bound at `bind` and connected to `connect`.
 */
export const peersSchema = z
  .object({
    /** false: no sharing even with NATS; true: a ZMQ mesh even with no peer listed yet. */
    enabled: bool("peer sharing"),
    /** This replica's PUB endpoint, e.g. tcp://127.0.0.1:7300 (loopback unless a secret is set). */
    bind: str("peer PUB endpoint"),
    /**
     * The endpoint peers found through etcd are told (default: the bound one, a wildcard host
     * replaced by this host's name), e.g. tcp://10.0.0.5:7300 behind NAT or in a pod.
     */
    advertise: str("peer advertised endpoint"),
    /** Peers' PUB endpoints (`--peers tcp://host:port,...`); this replica's own is skipped. */
    connect: strList("peer endpoints"),
    /** Shared secret: every announcement is signed (HMAC-SHA256) and only signed ones count. */
    secret: str("peer secret"),
    /** File holding the shared secret (keeps it out of argv and the config file). */
    secretFile: str("peer secret file"),
    /** How long a peer's announcement counts as pending on its worker. */
    ttlMs: posInt("peer announcement TTL"),
    /** Path nodes per announcement at most (a prefix-preserving digest of longer prompts). */
    maxNodes: num("peer announcement nodes", { int: true, min: 2, max: 65_536 }),
    /** One engine `/metrics` scrape shared among replicas (each worker scraped by one); default true. */
    shareLoad: bool("shared engine scrape"),
  })
  .partial()
  .strict();

/** The preset's knobs; the policy (pipeline) checks their names and values. */
export const policyOptionsSchema = z.record(
  z.string(),
  z.union([z.number().refine(Number.isFinite, "expected a finite number"), z.string(), z.boolean()], {
    errorMap: () => ({ message: "expected a number, a string or true/false" }),
  }),
);

/** One layer of the server config. */
export const serverConfigLayerSchema = z
  .object({
    // listener
    host: str("address to bind"),
    port: num("port", { int: true, min: 0, max: 65535 }),
    // discovery
    discovery: discoverySchema,
    // planes
    requestPlane: str("request plane"),
    eventPlane: z.enum(EVENT_PLANES, { errorMap: () => ({ message: "expected zmq or nats (event plane)" }) }),
    nats: natsSchema,
    // auth
    apiKeys: strList("API keys"),
    metricsPublic: bool("public /metrics"),
    // limits
    maxBodyBytes: posInt("max body size"),
    maxResponseBufferBytes: posInt("max response buffer"),
    requestTimeoutMs: ms("request timeout"),
    httpFront: z.enum(HTTP_FRONTS, { errorMap: () => ({ message: "expected raw or node (HTTP front)" }) }),
    drainTimeoutS: num("drain timeout, seconds", { min: 0 }),
    promptBudgetMs: ms("prompt tokenizing budget"),
    promptCacheTokens: num("prompt token cache size", { int: true, min: 0 }),
    modelGoneRetryS: num("model-gone retry window, seconds", { min: 0 }),
    // workers
    upstream: upstreamSchema,
    breaker: breakerSchema,
    scrapeIntervalMs: ms("scrape interval"),
    scrapeIdleIntervalMs: ms("idle scrape interval"),
    otlpEndpoint: str("OTLP endpoint"),
    maxRetries: num("max retries", { int: true, min: 0 }),
    // routing
    router: z.enum(ROUTER_MODES, {
      errorMap: () => ({ message: "expected auto, mixed or disagg (router)" }),
    }),
    tokenizer: str("tokenizer directory"),
    policy: str("routing policy"),
    policyOptions: policyOptionsSchema,
    profiles: profilesConfigSchema,
    disagg: disaggSchema,
    ingest: ingestSchema,
    peers: peersSchema,
    // flow control (src/router/flow)
    flow: flowConfigSchema,
  })
  .partial()
  .strict();

export type ServerConfigLayer = z.infer<typeof serverConfigLayerSchema>;
export type DisaggConfig = z.infer<typeof disaggSchema>;
export type IngestConfig = z.infer<typeof ingestSchema>;
export type PeersConfig = z.infer<typeof peersSchema>;

/** Where a layer came from, for error messages: `--config x.yaml`, `env`, `flags`, `config`. */
export interface LayerSource {
  /** The name of the layer as it starts a message. */
  readonly label: string;
  /** A more specific name for one key, e.g. `env INFERA_PORT` or `--port`. */
  where?(path: readonly (string | number)[]): string | undefined;
}

export class ConfigError extends Error {
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super(problems.join("\n"));
    this.problems = problems;
    this.name = "ConfigError";
  }
}

/** `profiles.prefill.scorers[1].weight` */
export function formatPath(path: readonly (string | number)[]): string {
  let s = "";
  for (const p of path) s += typeof p === "number" ? `[${p}]` : s === "" ? p : `.${p}`;
  return s;
}

function valueAt(root: unknown, path: readonly (string | number)[]): unknown {
  let cur = root;
  for (const p of path) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<string | number, unknown>)[p];
  }
  return cur;
}

function shown(v: unknown): string {
  if (typeof v === "number" && !Number.isFinite(v)) return String(v);
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

/** One line per problem: `<layer>: <key>: <message>, got <value>`. */
export function describeIssues(issues: readonly z.ZodIssue[], layer: unknown, src: LayerSource): string[] {
  const out: string[] = [];
  for (const i of issues) {
    if (i.code === "unrecognized_keys") {
      for (const k of i.keys) {
        const path = [...i.path, k];
        out.push(`${src.where?.(path) ?? `${src.label}: ${formatPath(path)}`}: unknown key`);
      }
      continue;
    }
    const where = src.where?.(i.path) ?? `${src.label}: ${formatPath(i.path)}`;
    const v = valueAt(layer, i.path);
    const got = v === undefined || (typeof v === "object" && v !== null) ? "" : `, got ${shown(v)}`;
    out.push(`${where}: ${i.message}${got}`);
  }
  return out;
}

/** Validates one layer; throws a ConfigError naming the layer and each bad key. */
export function parseLayer(layer: unknown, src: LayerSource): ServerConfigLayer {
  const r = serverConfigLayerSchema.safeParse(layer);
  if (r.success) return r.data;
  throw new ConfigError(describeIssues(r.error.issues, layer, src));
}
