/**
 * Every `INFERA_*` environment variable, in one table: its type, which command reads it, the
 * server config key it feeds (the server's env layer is built from this table, see
 * src/server/config.ts) and what it does. test/server/config-schema.test.ts greps src/ for
 * `INFERA_*` names and fails on one missing here, and checks that docs/configuration.md shows
 * this table as it is (`node scripts/gen-config-doc.ts` rewrites it).
 *
 * A leaf module (no imports), so any file may read its variables through `envVar`.
 */

export type EnvType = "string" | "integer" | "number" | "boolean" | "list" | "path";

export interface EnvVarSpec {
  readonly name: string;
  readonly type: EnvType;
  /** The commands (or modules) that read it. */
  readonly readBy: string;
  /** Dotted path of the `infera server` config key it sets, when it is a server setting. */
  readonly configKey?: string;
  /** Printed as "***" (`--print-config`) and never logged. */
  readonly secret?: boolean;
  readonly description: string;
}

const v = (
  name: string,
  type: EnvType,
  readBy: string,
  description: string,
  extra: { configKey?: string; secret?: boolean } = {},
): EnvVarSpec => ({ name, type, readBy, description, ...extra });

/** Order matters where two variables feed one key: the first one set wins (INFERA_API_KEYS over INFERA_API_KEY). */
export const ENV_TABLE: readonly EnvVarSpec[] = [
  // ---- infera server (each one a key of the server config; flags win over them, they win over --config)
  v("INFERA_HOST", "string", "server", "Address to bind (`--host`).", { configKey: "host" }),
  v("INFERA_PORT", "integer", "server", "Port to listen on; 0 = any free port (`--port`).", {
    configKey: "port",
  }),
  v("INFERA_POLICY", "string", "server", "Routing policy preset (`--policy`).", { configKey: "policy" }),
  v("INFERA_ROUTER", "string", "server", "Router mode: auto | mixed | disagg (`--router`).", {
    configKey: "router",
  }),
  v("INFERA_API_KEYS", "list", "server, up", "Accepted API keys, comma-separated (`--api-key`).", {
    configKey: "apiKeys",
    secret: true,
  }),
  v(
    "INFERA_API_KEY",
    "list",
    "server, up, bench",
    "server, up: same as INFERA_API_KEYS when that is unset; bench: the bearer token it sends (`--api-key`).",
    { configKey: "apiKeys", secret: true },
  ),
  v("INFERA_METRICS_PUBLIC", "boolean", "server", "Serve /metrics without an API key (`--metrics-public`).", {
    configKey: "metricsPublic",
  }),
  v(
    "INFERA_MAX_BODY_BYTES",
    "integer",
    "server",
    "Largest request body accepted, in bytes (`--max-body-size`).",
    {
      configKey: "maxBodyBytes",
    },
  ),
  v(
    "INFERA_MAX_RESPONSE_BUFFER_BYTES",
    "integer",
    "server",
    "Non-streamed answers are held to be checked up to this size (`--max-response-buffer`).",
    { configKey: "maxResponseBufferBytes" },
  ),
  v(
    "INFERA_REQUEST_TIMEOUT_MS",
    "integer",
    "server",
    "A client's whole request must arrive within this, else 408; 0 = off (`--request-timeout`).",
    { configKey: "requestTimeoutMs" },
  ),
  v(
    "INFERA_HTTP_FRONT",
    "string",
    "server",
    "Who parses client requests: raw (plain requests to the API and status routes off the socket, the rest node:http) | node (`--http-front`).",
    { configKey: "httpFront" },
  ),
  v(
    "INFERA_UPSTREAM_HEADERS_TIMEOUT_MS",
    "integer",
    "server",
    "Wait for a worker's answer headers, else 504 (`--upstream-headers-timeout`).",
    { configKey: "upstream.headersTimeoutMs" },
  ),
  v(
    "INFERA_UPSTREAM_BODY_TIMEOUT_MS",
    "integer",
    "server",
    "Longest gap between a worker's answer chunks (`--upstream-body-timeout`).",
    { configKey: "upstream.bodyTimeoutMs" },
  ),
  v(
    "INFERA_PROMPT_BUDGET_MS",
    "integer",
    "server",
    "Tokenizing time per request for routing; past it, routing scores the head it has (`--prompt-budget`).",
    { configKey: "promptBudgetMs" },
  ),
  v(
    "INFERA_PROMPT_CACHE_TOKENS",
    "integer",
    "server",
    "Token ids kept of recent prompts for the next turn; 0 = off (`--prompt-cache-tokens`).",
    { configKey: "promptCacheTokens" },
  ),
  v(
    "INFERA_DRAIN_TIMEOUT_S",
    "number",
    "server",
    "On SIGTERM, how long requests in flight may finish before exit (`--drain-timeout`).",
    { configKey: "drainTimeoutS" },
  ),
  v(
    "INFERA_MODEL_GONE_RETRY_S",
    "number",
    "server",
    "A model whose workers all left within this many seconds is answered 503 + Retry-After, not 404 (`--model-gone-retry`; 0 = off).",
    { configKey: "modelGoneRetryS" },
  ),
  v("INFERA_TOKENIZER", "path", "server", "Model directory with tokenizer.json (`--tokenizer`).", {
    configKey: "tokenizer",
  }),
  v(
    "INFERA_SCRAPE_INTERVAL_MS",
    "integer",
    "server",
    "Engine /metrics scrape interval; 0 = off (`--scrape-interval`).",
    {
      configKey: "scrapeIntervalMs",
    },
  ),
  v(
    "INFERA_SCRAPE_IDLE_INTERVAL_MS",
    "integer",
    "server",
    "Scrape interval of an idle, unchanged worker; 0 = always the scrape interval (`--scrape-idle-interval`).",
    { configKey: "scrapeIdleIntervalMs" },
  ),
  v(
    "INFERA_OTLP_ENDPOINT",
    "string",
    "server",
    "OTLP/HTTP collector for request traces; tracing is off when unset (`--otlp-endpoint`). A URL " +
      "with a password (sent as Basic auth) goes here or in the config file, never on argv; other " +
      "headers in OTEL_EXPORTER_OTLP_HEADERS.",
    { configKey: "otlpEndpoint" },
  ),
  v(
    "INFERA_MAX_RETRIES",
    "integer",
    "server",
    "Retries on another worker after a connection failure (`--max-retries`).",
    {
      configKey: "maxRetries",
    },
  ),
  v(
    "INFERA_REQUEST_PLANE",
    "string",
    "server, engine",
    "How the server reaches workers: http | nats (`--request-plane`).",
    {
      configKey: "requestPlane",
    },
  ),
  v(
    "INFERA_EVENT_PLANE",
    "string",
    "server, engine",
    "How KV events reach servers: zmq | nats (`--event-plane`).",
    {
      configKey: "eventPlane",
    },
  ),
  v("INFERA_NATS_URL", "string", "server, engine", "NATS server URL(s), comma-separated (`--nats-url`).", {
    configKey: "nats.url",
  }),
  v("INFERA_NATS_TOKEN", "string", "server, engine", "NATS auth token (`--nats-token`).", {
    configKey: "nats.token",
    secret: true,
  }),
  v("INFERA_NATS_USER", "string", "server, engine", "NATS user (`--nats-user`).", { configKey: "nats.user" }),
  v("INFERA_NATS_PASSWORD", "string", "server, engine", "NATS password (`--nats-password`).", {
    configKey: "nats.password",
    secret: true,
  }),
  v(
    "INFERA_NATS_NKEY_SEED_FILE",
    "path",
    "server, engine",
    "File holding a NATS nkey user seed (`--nats-nkey-seed-file`).",
    {
      configKey: "nats.nkeySeedFile",
    },
  ),
  v(
    "INFERA_NATS_ALLOW_ANONYMOUS",
    "boolean",
    "server, engine",
    "Connect to a NATS that takes clients without auth, without the warning (`--nats-allow-anonymous`).",
    { configKey: "nats.allowAnonymous" },
  ),
  v(
    "INFERA_NATS_RECONNECT_WAIT_MS",
    "integer",
    "server",
    "How long a request not yet streaming waits for a lost NATS connection (`--nats-reconnect-wait-ms`).",
    { configKey: "nats.reconnectWaitMs" },
  ),
  v(
    "INFERA_PEERS",
    "list",
    "server",
    "Peer replicas' announcement endpoints, comma-separated, e.g. tcp://10.0.0.2:7300 (`--peers`).",
    { configKey: "peers.connect" },
  ),
  v(
    "INFERA_PEERS_BIND",
    "string",
    "server",
    "This replica's announcement PUB endpoint; loopback unless a secret is set (`--peers-bind`).",
    { configKey: "peers.bind" },
  ),
  v(
    "INFERA_PEERS_ADVERTISE",
    "string",
    "server",
    "The announce endpoint registered in etcd for peers to follow (default: the bound one).",
    { configKey: "peers.advertise" },
  ),
  v(
    "INFERA_PEERS_ENABLED",
    "boolean",
    "server",
    "Share routing state with peer replicas: false turns it off (also with NATS); true starts the ZMQ mesh (peers found through etcd with etcd discovery).",
    { configKey: "peers.enabled" },
  ),
  v("INFERA_PEERS_SECRET", "string", "server", "Shared secret that signs replicas' announcements.", {
    configKey: "peers.secret",
    secret: true,
  }),
  v(
    "INFERA_PEERS_SECRET_FILE",
    "path",
    "server",
    "File holding the replicas' shared secret (`--peers-secret-file`).",
    { configKey: "peers.secretFile" },
  ),
  v(
    "INFERA_PEERS_TTL_MS",
    "integer",
    "server",
    "How long a peer's announcement counts as pending on its worker (default 15000).",
    { configKey: "peers.ttlMs" },
  ),
  v(
    "INFERA_PEERS_SHARE_LOAD",
    "boolean",
    "server",
    "With a peer plane, each engine's /metrics is scraped by one replica and its readings shared; false: every replica scrapes every engine (default true).",
    { configKey: "peers.shareLoad" },
  ),
  v(
    "INFERA_FLOW_ENABLED",
    "boolean",
    "server",
    "Flow control: admission queue, priority bands, tenant fairness, RPM/TPM limits (`--flow`).",
    { configKey: "flow.enabled" },
  ),
  v(
    "INFERA_FLOW_MAX_QUEUE",
    "integer",
    "server",
    "Requests queued for admission at most, this replica (default 1000; `--flow-max-queue`).",
    { configKey: "flow.maxQueue" },
  ),
  v(
    "INFERA_FLOW_MAX_WAIT_MS",
    "integer",
    "server",
    "A queued request's maximum wait before 429, a band's default (default 30000; `--flow-max-wait`).",
    { configKey: "flow.maxWaitMs" },
  ),
  v(
    "INFERA_FLOW_TENANT_HEADER",
    "boolean",
    "server",
    "Key flows by the x-infera-tenant header instead of the API key (`--flow-tenant-header`).",
    { configKey: "flow.tenantHeader" },
  ),
  v(
    "INFERA_FLOW_REPLICAS",
    "integer",
    "server",
    "Server replicas behind the balancer: the per-key RPM/TPM limits are split among them, and without a peer plane the `load` headroom counts this replica's dispatches since a reading once per replica (default 1; `--flow-replicas`).",
    { configKey: "flow.replicas" },
  ),
  v(
    "INFERA_DISCOVERY",
    "string",
    "server, engine",
    "Discovery backend: memory | static | etcd | moriio (engine: etcd | none).",
    {
      configKey: "discovery.kind",
    },
  ),
  v("INFERA_WORKERS", "list", "server", "Static worker base URLs, comma-separated (`--worker`).", {
    configKey: "discovery.workers",
  }),
  v("INFERA_WORKERS_FILE", "path", "server", "JSON/YAML list of partial worker records (`--workers-file`).", {
    configKey: "discovery.workersFile",
  }),
  v("INFERA_ETCD", "list", "server, engine", "etcd endpoints, comma-separated (`--etcd`).", {
    configKey: "discovery.etcdEndpoints",
  }),
  v("INFERA_ETCD_ENDPOINTS", "list", "server, engine", "Same as INFERA_ETCD (used when that is unset).", {
    configKey: "discovery.etcdEndpoints",
  }),
  v(
    "INFERA_DISCOVERY_PREFIX",
    "string",
    "server",
    "Registry key prefix (`--discovery-prefix`, default /infera).",
    {
      configKey: "discovery.prefix",
    },
  ),
  v("INFERA_ETCD_USER", "string", "server, engine", "etcd user (`--etcd-user`).", {
    configKey: "discovery.options.username",
  }),
  v("INFERA_ETCD_PASSWORD", "string", "server, engine", "etcd password (`--etcd-password`).", {
    configKey: "discovery.options.password",
    secret: true,
  }),
  // ---- other commands
  v(
    "INFERA_ETCD_PREFIX",
    "string",
    "engine",
    "etcd key prefix the engine launcher registers under (`--etcd-prefix`).",
  ),
  v("INFERA_LOG_LEVEL", "string", "all", "pino log level (default info; tests use silent or warn)."),
  v(
    "INFERA_KV_ZMQ_NATIVE",
    "string",
    "server",
    "`0`: read KV event SUB sockets with zeromq.js instead of libzmq's C API (src/kv/feeds/zmq-native.ts).",
  ),
  v(
    "INFERA_KV_FD_WATCHER",
    "string",
    "server",
    "`thread`: wait for the native KV sockets in a worker thread instead of on the main thread's own event loop (src/kv/feeds/loop-fd-watcher.ts).",
  ),
  v(
    "INFERA_MORIIO_PROXY",
    "string",
    "engine",
    "MoRIIO proxy HOST[:PORT] for vllm --connector moriio (`--moriio-proxy`).",
  ),
  v(
    "INFERA_ADVERTISE_HOST",
    "string",
    "engine",
    "Host the worker advertises in its registration (`--advertise-host`).",
  ),
  v(
    "INFERA_SHOW_GIDS_CMD",
    "string",
    "engine",
    "Command printing show_gids output, for the RDMA GID index (`--show-gids-cmd`).",
  ),
  v(
    "INFERA_KVD_REMOTE_URL",
    "string",
    "kvd",
    "L4 store URL (`--remote`); the way to pass one with a password (argv refuses it), or `--remote-file`.",
    { secret: true },
  ),
  v(
    "INFERA_KVD_TCP_TOKEN",
    "string",
    "kvd",
    "Shared secret TCP clients send in HELLO (`--tcp-token-file`).",
    {
      secret: true,
    },
  ),
  v("INFERA_KVD_AIS", "boolean", "kvd", "1 = probe AIS/hipFile for GPU-direct L3 reads."),
  v("INFERA_KVD_DIRECT_READ", "boolean", "kvd", "0 = no O_DIRECT reads of the disk tier."),
  v(
    "INFERA_KVD_SNDBUF",
    "integer",
    "kvd",
    "SO_SNDBUF asked for on kvd's Unix sockets, bytes; 0 = OS default.",
  ),
  v(
    "INFERA_KVD_SOCKET",
    "path",
    "deploy (worker pods)",
    "kvd's Unix socket path, set in the worker pods' environment.",
  ),
  v("INFERA_SIM_CPU_PROF", "path", "sim", "Write a V8 CPU profile of the simulator to this file on stop."),
  v(
    "INFERA_SIM_EXIT_WITH_PARENT",
    "boolean",
    "sim",
    "1 = stop when the parent process is gone (`infera up` sets it for its fleet).",
  ),
  v("INFERA_SIM_KV_MAX_TRANSFER_BYTES", "integer", "sim", "Cap on the bytes one simulated KV pull moves."),
  v("INFERA_SIM_KV_PULL_TIMEOUT_MS", "integer", "sim", "How long a simulated D waits for a KV pull."),
  v("INFERA_SIM_KV_HOLD_TIMEOUT_MS", "integer", "sim", "How long a simulated P keeps blocks nobody pulled."),
  v("INFERA_DIST", "boolean", "bin/infera.js", "0 = run the TypeScript sources even when dist/ is current."),
  v("INFERA_TEST_CONCURRENCY", "integer", "scripts/run-tests.mjs", "Test files run at once."),
];

const byName = new Map(ENV_TABLE.map((e) => [e.name, e]));

/** The table's entry; throws for a name not in it (so a read cannot bypass the table). */
export function envSpec(name: string): EnvVarSpec {
  const e = byName.get(name);
  if (!e) throw new Error(`${name} is not in the INFERA_* table (src/config/env-table.ts)`);
  return e;
}

/** The raw value of a tabled variable; "" counts as unset. */
export function envVar(name: string, env: NodeJS.ProcessEnv = process.env): string | undefined {
  envSpec(name);
  const raw = env[name];
  return raw === undefined || raw === "" ? undefined : raw;
}

/** The table as markdown (docs/configuration.md). */
export function envTableMarkdown(): string {
  const esc = (s: string) => s.replaceAll("|", "\\|");
  const rows = ENV_TABLE.map(
    (e) =>
      `| \`${e.name}\` | ${e.type} | ${esc(e.readBy)} | ${e.configKey ? `\`${e.configKey}\`` : ""} | ${esc(
        e.description,
      )}${e.secret ? " Secret." : ""} |`,
  );
  return [
    "| Variable | Type | Read by | Server config key | Description |",
    "|---|---|---|---|---|",
    ...rows,
  ].join("\n");
}
