/**
 * Server configuration: defaults < config file (YAML/JSON, `--config`) < environment
 * (`INFERA_*`) < command-line flags. `resolveServerConfig` merges the layers; the CLI passes
 * only the flags the user actually gave, so defaults never mask the file or environment.
 */
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import type { DiscoveryConfig } from "../discovery/index.ts";
import type { RouterMode } from "../router/auto.ts";
import type { ProfilesConfig } from "../router/pipeline/config-schema.ts";
import type { BreakerOptions } from "../router/worker-set.ts";
import type { HttpExecutorOptions } from "../transport/http.ts";
import { natsConnectFromEnv } from "../transport/nats/cli-options.ts";
import type { NatsConnectOptions } from "../transport/nats/connection.ts";

export interface ServerConfig {
  host: string;
  /** 0 = any free port (tests). */
  port: number;
  discovery: DiscoveryConfig;
  policy: string;
  policyOptions: Record<string, unknown>;
  /** Step profiles overriding the policy preset's (src/router/pipeline/config-schema.ts). */
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
   * Non-streamed answers are held (to check them) up to this size; a larger one is relayed as
   * it arrives, unchecked, so a few huge answers cannot exhaust memory.
   */
  maxResponseBufferBytes: number;
  /** Serve /metrics without an API key even when keys are set (it lists every worker's address). */
  metricsPublic: boolean;
  /** Model directory with tokenizer.json (+ chat template); the built-in BPE when absent. */
  tokenizer?: string;
  /** Engine `/metrics` scrape interval; 0 disables the scraper. */
  scrapeIntervalMs: number;
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
}

export type ServerConfigInput = Partial<Omit<ServerConfig, "discovery">> & {
  discovery?: Partial<DiscoveryConfig>;
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
  maxResponseBufferBytes: 16 * 1024 * 1024,
  metricsPublic: false,
  scrapeIntervalMs: 2000,
  maxRetries: 2,
  breaker: {},
  // A non-streamed answer's headers come only when it is complete, hence 10 minutes; a stream
  // may sit in the engine's queue before its first token, hence 5 minutes between chunks.
  upstream: { headersTimeoutMs: 600_000, bodyTimeoutMs: 300_000 },
  requestPlane: "http",
};

const list = (v: string | undefined): string[] | undefined =>
  v === undefined
    ? undefined
    : v
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
const num = (v: string | undefined): number | undefined =>
  v === undefined || v === "" ? undefined : Number(v);
const bool = (v: string | undefined): boolean | undefined =>
  v === undefined || v === "" ? undefined : /^(1|true|yes|on)$/i.test(v);

/** The `INFERA_*` environment layer. */
export function configFromEnv(env: NodeJS.ProcessEnv = process.env): ServerConfigInput {
  const out: ServerConfigInput = {
    host: env.INFERA_HOST,
    port: num(env.INFERA_PORT),
    policy: env.INFERA_POLICY,
    router: env.INFERA_ROUTER as RouterMode | undefined,
    apiKeys: list(env.INFERA_API_KEYS ?? env.INFERA_API_KEY),
    maxBodyBytes: num(env.INFERA_MAX_BODY_BYTES),
    requestTimeoutMs: num(env.INFERA_REQUEST_TIMEOUT_MS),
    maxResponseBufferBytes: num(env.INFERA_MAX_RESPONSE_BUFFER_BYTES),
    metricsPublic: bool(env.INFERA_METRICS_PUBLIC),
    upstream: {
      headersTimeoutMs: num(env.INFERA_UPSTREAM_HEADERS_TIMEOUT_MS),
      bodyTimeoutMs: num(env.INFERA_UPSTREAM_BODY_TIMEOUT_MS),
    },
    tokenizer: env.INFERA_TOKENIZER,
    scrapeIntervalMs: num(env.INFERA_SCRAPE_INTERVAL_MS),
    maxRetries: num(env.INFERA_MAX_RETRIES),
    requestPlane: env.INFERA_REQUEST_PLANE,
    eventPlane: env.INFERA_EVENT_PLANE,
    nats: natsConnectFromEnv(env),
    discovery: {
      kind: env.INFERA_DISCOVERY,
      workers: list(env.INFERA_WORKERS),
      workersFile: env.INFERA_WORKERS_FILE,
      etcdEndpoints: list(env.INFERA_ETCD ?? env.INFERA_ETCD_ENDPOINTS),
      prefix: env.INFERA_DISCOVERY_PREFIX,
    },
  };
  return out;
}

/** The config-file layer: YAML or JSON with the keys of ServerConfig. */
export function configFromFile(path: string): ServerConfigInput {
  const text = readFileSync(path, "utf8");
  const doc: unknown = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  if (doc === null || doc === undefined) return {};
  if (typeof doc !== "object" || Array.isArray(doc)) throw new Error(`${path}: expected a mapping`);
  return doc as ServerConfigInput;
}

function defined<T extends object>(o: T | undefined): Partial<T> {
  const out: Partial<T> = {};
  if (!o) return out;
  for (const k of Object.keys(o) as (keyof T)[]) if (o[k] !== undefined) out[k] = o[k];
  return out;
}

/** Merges layers left to right (later wins), field by field; nested objects merge too. */
export function mergeConfig(...layers: (ServerConfigInput | undefined)[]): ServerConfig {
  let cfg: ServerConfig = { ...defaultServerConfig, discovery: { ...defaultServerConfig.discovery } };
  for (const layer of layers) {
    if (!layer) continue;
    const { discovery, breaker, upstream, policyOptions, ...rest } = layer;
    cfg = {
      ...cfg,
      ...defined(rest),
      discovery: { ...cfg.discovery, ...defined(discovery) } as DiscoveryConfig,
      breaker: { ...cfg.breaker, ...defined(breaker) },
      upstream: { ...cfg.upstream, ...defined(upstream) },
      policyOptions: { ...cfg.policyOptions, ...defined(policyOptions) },
    };
  }
  // Workers given without a backend choice mean static discovery.
  const d = cfg.discovery;
  const explicitKind = layers.some((l) => l?.discovery?.kind !== undefined);
  if (!explicitKind && ((d.workers?.length ?? 0) > 0 || d.workersFile))
    cfg.discovery = { ...d, kind: "static" };
  // A NATS URL without plane choices means NATS for both (the production setup).
  if (cfg.nats?.url) {
    if (!layers.some((l) => l?.requestPlane !== undefined)) cfg.requestPlane = "nats";
    if (!layers.some((l) => l?.eventPlane !== undefined)) cfg.eventPlane = "nats";
  }
  validateConfig(cfg);
  return cfg;
}

function validateConfig(c: ServerConfig): void {
  if (!Number.isInteger(c.port) || c.port < 0 || c.port > 65535) throw new Error(`invalid port ${c.port}`);
  if (!(c.maxBodyBytes > 0)) throw new Error(`invalid max body size ${c.maxBodyBytes}`);
  if (!(c.maxResponseBufferBytes > 0))
    throw new Error(`invalid max response buffer ${c.maxResponseBufferBytes}`);
  const ms = (v: unknown) => typeof v === "number" && Number.isInteger(v) && v >= 0;
  if (!ms(c.requestTimeoutMs)) throw new Error(`invalid request timeout ${c.requestTimeoutMs}`);
  if (c.upstream.headersTimeoutMs !== undefined && !ms(c.upstream.headersTimeoutMs))
    throw new Error(`invalid upstream headers timeout ${c.upstream.headersTimeoutMs}`);
  if (c.upstream.bodyTimeoutMs !== undefined && !ms(c.upstream.bodyTimeoutMs))
    throw new Error(`invalid upstream body timeout ${c.upstream.bodyTimeoutMs}`);
  if (!["auto", "mixed", "disagg"].includes(c.router)) throw new Error(`invalid --router ${c.router}`);
  if (!(c.scrapeIntervalMs >= 0)) throw new Error(`invalid scrape interval ${c.scrapeIntervalMs}`);
  if (!(Number.isInteger(c.maxRetries) && c.maxRetries >= 0))
    throw new Error(`invalid max retries ${c.maxRetries}`);
}

/** File, then environment, then flags. */
export function resolveServerConfig(flags: ServerConfigInput, configFile?: string): ServerConfig {
  return mergeConfig(configFile ? configFromFile(configFile) : undefined, configFromEnv(), flags);
}
