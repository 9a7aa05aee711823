import type { Command } from "commander";
import { type ConfigOptions, type ServerConfigInput, validateLayer } from "../server/config.ts";
import { ConfigError, type LayerSource } from "../server/config-schema.ts";
import { addNatsOptions, type NatsCliValues } from "../transport/nats/cli-options.ts";
import { maskUrlUserinfo, urlHasPassword } from "../util/mask.ts";
import { natsArgvSecrets, refuseArgvSecrets } from "./argv-secrets.ts";

const collect = (v: string, prev: string[] | undefined): string[] => [...(prev ?? []), v];

/** Parses sizes like `4194304`, `4MiB`, `512k`. */
export function parseSize(v: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*([kmg]?)(i?b)?$/i.exec(v.trim());
  if (!m) throw new Error(`invalid size '${v}'`);
  const mult = { "": 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3 }[m[2]!.toLowerCase() as "" | "k" | "m" | "g"];
  return Math.floor(Number(m[1]) * mult);
}

function parseOptionPairs(pairs: string[] | undefined): Record<string, unknown> | undefined {
  if (!pairs) return undefined;
  const out: Record<string, unknown> = {};
  for (const p of pairs) {
    const eq = p.indexOf("=");
    if (eq <= 0) throw new ConfigError([`--policy-option: expected key=value, got '${p}'`]);
    const raw = p.slice(eq + 1);
    const n = Number(raw);
    out[p.slice(0, eq)] =
      raw === "true" ? true : raw === "false" ? false : raw !== "" && !Number.isNaN(n) ? n : raw;
  }
  return out;
}

/** The kv-aware weight flags, folded into the policy options (a --policy-option of the same key wins). */
function kvPolicyFlags(
  f: ServerFlags,
  opts: Record<string, unknown> | undefined,
): Record<string, unknown> | undefined {
  const kv: Record<string, unknown> = {};
  const n = (flag: string, v: string | undefined) => {
    if (v === undefined) return undefined;
    const x = Number(v);
    if (v.trim() === "" || !Number.isFinite(x))
      throw new ConfigError([`${flag}: expected a number, got "${v}"`]);
    return x;
  };
  if (f.kvOverlapWeight !== undefined) kv.overlapWeight = n("--kv-overlap-weight", f.kvOverlapWeight);
  if (f.kvTemperature !== undefined) kv.temperature = n("--kv-temperature", f.kvTemperature);
  if (f.kvBalanceAbs !== undefined) kv.balanceAbsThreshold = n("--kv-balance-abs", f.kvBalanceAbs);
  if (f.kvBalanceRel !== undefined) kv.balanceRelThreshold = n("--kv-balance-rel", f.kvBalanceRel);
  return Object.keys(kv).length === 0 ? opts : { ...kv, ...opts };
}

interface ServerFlags extends NatsCliValues {
  host?: string;
  port?: string;
  config?: string;
  discovery?: string;
  worker?: string[];
  workersFile?: string;
  etcd?: string[];
  discoveryPrefix?: string;
  etcdUser?: string;
  etcdPassword?: string;
  etcdCa?: string;
  etcdCert?: string;
  etcdKey?: string;
  policy?: string;
  policyOption?: string[];
  kvOverlapWeight?: string;
  kvTemperature?: string;
  kvBalanceAbs?: string;
  kvBalanceRel?: string;
  router?: string;
  httpFront?: string;
  apiKey?: string[];
  maxBodySize?: string;
  requestTimeout?: string;
  upstreamHeadersTimeout?: string;
  upstreamBodyTimeout?: string;
  maxResponseBuffer?: string;
  promptBudget?: string;
  promptCacheTokens?: string;
  metricsPublic?: boolean;
  drainTimeout?: string;
  modelGoneRetry?: string;
  tokenizer?: string;
  scrapeInterval?: string;
  scrapeIdleInterval?: string;
  otlpEndpoint?: string;
  maxRetries?: string;
  requestPlane?: string;
  peers?: string[];
  peersBind?: string;
  peersSecretFile?: string;
  flow?: boolean;
  flowMaxQueue?: string;
  flowMaxWait?: string;
  flowTenantHeader?: boolean;
  flowReplicas?: string;
  printConfig?: boolean;
}

/** A number from a flag's text; text that is not one stays text, so the schema names the flag. */
const optNum = (v: string | undefined): number | string | undefined => {
  if (v === undefined) return undefined;
  const n = Number(v);
  return v.trim() === "" || Number.isNaN(n) ? v : n;
};

function optSize(flag: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  try {
    return parseSize(v);
  } catch (e) {
    throw new ConfigError([`${flag}: ${(e as Error).message}`]);
  }
}

/** Config key → the flag that sets it, so the flag layer's errors name the flag (`--port: ...`). */
export const FLAG_FOR_KEY: Readonly<Record<string, string>> = {
  host: "--host",
  port: "--port",
  policy: "--policy",
  "policyOptions.overlapWeight": "--kv-overlap-weight / --policy-option overlapWeight",
  "policyOptions.temperature": "--kv-temperature / --policy-option temperature",
  "policyOptions.balanceAbsThreshold": "--kv-balance-abs / --policy-option balanceAbsThreshold",
  "policyOptions.balanceRelThreshold": "--kv-balance-rel / --policy-option balanceRelThreshold",
  router: "--router",
  apiKeys: "--api-key",
  maxBodyBytes: "--max-body-size",
  requestTimeoutMs: "--request-timeout",
  httpFront: "--http-front",
  maxResponseBufferBytes: "--max-response-buffer",
  promptBudgetMs: "--prompt-budget",
  promptCacheTokens: "--prompt-cache-tokens",
  drainTimeoutS: "--drain-timeout",
  modelGoneRetryS: "--model-gone-retry",
  metricsPublic: "--metrics-public",
  "upstream.headersTimeoutMs": "--upstream-headers-timeout",
  "upstream.bodyTimeoutMs": "--upstream-body-timeout",
  tokenizer: "--tokenizer",
  scrapeIntervalMs: "--scrape-interval",
  scrapeIdleIntervalMs: "--scrape-idle-interval",
  otlpEndpoint: "--otlp-endpoint",
  maxRetries: "--max-retries",
  requestPlane: "--request-plane",
  "peers.connect": "--peers",
  "peers.bind": "--peers-bind",
  "peers.secretFile": "--peers-secret-file",
  "flow.enabled": "--flow",
  "flow.maxQueue": "--flow-max-queue",
  "flow.maxWaitMs": "--flow-max-wait",
  "flow.tenantHeader": "--flow-tenant-header",
  "flow.replicas": "--flow-replicas",
  eventPlane: "--event-plane",
  "nats.url": "--nats-url",
  "nats.token": "--nats-token",
  "nats.user": "--nats-user",
  "nats.password": "--nats-password",
  "nats.nkeySeedFile": "--nats-nkey-seed-file",
  "nats.tls.caFile": "--nats-tls-ca",
  "nats.tls.certFile": "--nats-tls-cert",
  "nats.tls.keyFile": "--nats-tls-key",
  "nats.reconnectWaitMs": "--nats-reconnect-wait-ms",
  "nats.allowAnonymous": "--nats-allow-anonymous",
  "discovery.kind": "--discovery",
  "discovery.workers": "--worker",
  "discovery.workersFile": "--workers-file",
  "discovery.etcdEndpoints": "--etcd",
  "discovery.prefix": "--discovery-prefix",
  "discovery.options.username": "--etcd-user",
  "discovery.options.password": "--etcd-password",
  "discovery.options.caFile": "--etcd-ca",
  "discovery.options.certFile": "--etcd-cert",
  "discovery.options.keyFile": "--etcd-key",
};

/** The flag layer's name in errors: the flag itself where one sets the key. */
export const flagSource: LayerSource = {
  label: "flags",
  where: (path) => {
    const strings = path.filter((p): p is string => typeof p === "string");
    for (let n = strings.length; n > 0; n--) {
      const flag = FLAG_FOR_KEY[strings.slice(0, n).join(".")];
      if (flag) return flag;
    }
    if (strings[0] === "policyOptions" && strings[1]) return `--policy-option ${strings[1]}`;
    return undefined;
  },
};

/**
 * `--otlp-endpoint`, refused when its URL carries a password: argv is readable by every user of
 * the host (`ps`, /proc/PID/cmdline). The same URL is taken from INFERA_OTLP_ENDPOINT or the
 * config file; a token goes in OTEL_EXPORTER_OTLP_HEADERS, which the exporter reads itself.
 */
function otlpEndpointFlag(url: string | undefined): string | undefined {
  if (url === undefined || !urlHasPassword(url)) return url;
  throw new ConfigError([
    `--otlp-endpoint ${maskUrlUserinfo(url)}: carries a password on the command line, where any ` +
      "user of the host can read it: set the URL in INFERA_OTLP_ENDPOINT or `otlpEndpoint` in the " +
      "--config file, or send the credentials as a header in OTEL_EXPORTER_OTLP_HEADERS " +
      "(e.g. Authorization=Basic%20<base64>)",
  ]);
}

/** The flag layer of the server config: only flags the user gave, validated (errors name the flag). */
export function flagsToConfig(f: ServerFlags, o: ConfigOptions = {}): ServerConfigInput {
  const raw = {
    host: f.host,
    port: optNum(f.port),
    policy: f.policy,
    policyOptions: kvPolicyFlags(f, parseOptionPairs(f.policyOption)),
    router: f.router,
    apiKeys: f.apiKey,
    maxBodyBytes: optSize("--max-body-size", f.maxBodySize),
    requestTimeoutMs: optNum(f.requestTimeout),
    httpFront: f.httpFront,
    maxResponseBufferBytes: optSize("--max-response-buffer", f.maxResponseBuffer),
    promptBudgetMs: optNum(f.promptBudget),
    promptCacheTokens: optNum(f.promptCacheTokens),
    drainTimeoutS: optNum(f.drainTimeout),
    modelGoneRetryS: optNum(f.modelGoneRetry),
    metricsPublic: f.metricsPublic,
    upstream: {
      headersTimeoutMs: optNum(f.upstreamHeadersTimeout),
      bodyTimeoutMs: optNum(f.upstreamBodyTimeout),
    },
    tokenizer: f.tokenizer,
    scrapeIntervalMs: optNum(f.scrapeInterval),
    scrapeIdleIntervalMs: optNum(f.scrapeIdleInterval),
    otlpEndpoint: otlpEndpointFlag(f.otlpEndpoint),
    maxRetries: optNum(f.maxRetries),
    requestPlane: f.requestPlane,
    eventPlane: f.eventPlane,
    peers: peerFlags(f),
    flow: flowFlags(f),
    nats: natsFlags(f),
    discovery: {
      kind: f.discovery,
      workers: f.worker,
      workersFile: f.workersFile,
      etcdEndpoints: f.etcd,
      prefix: f.discoveryPrefix,
      options: etcdAuthOptions(f),
    },
  };
  return validateLayer(raw, flagSource, o);
}

/**
 * The --nats-* flags given, each on its own (no URL needed: the URL may come from the file or
 * the environment, and the layers merge field by field).
 */
function natsFlags(f: ServerFlags): Record<string, unknown> | undefined {
  const tls =
    f.natsTlsCa || f.natsTlsCert || f.natsTlsKey
      ? { caFile: f.natsTlsCa, certFile: f.natsTlsCert, keyFile: f.natsTlsKey }
      : undefined;
  const o = {
    url: f.natsUrl === "" ? undefined : f.natsUrl,
    token: f.natsToken,
    user: f.natsUser,
    password: f.natsPassword,
    nkeySeedFile: f.natsNkeySeedFile,
    tls,
    reconnectWaitMs: optNum(f.natsReconnectWaitMs),
    allowAnonymous: f.natsAllowAnonymous,
  };
  return Object.values(o).some((v) => v !== undefined) ? o : undefined;
}

/** --peers / --peers-bind / --peers-secret-file; undefined when none given. */
function peerFlags(f: ServerFlags): Record<string, unknown> | undefined {
  const connect = f.peers?.flatMap((p) => p.split(",").map((s) => s.trim())).filter(Boolean);
  const o = { connect, bind: f.peersBind, secretFile: f.peersSecretFile };
  return Object.values(o).some((v) => v !== undefined) ? o : undefined;
}

/** --flow and --flow-*; undefined when none given. */
function flowFlags(f: ServerFlags): Record<string, unknown> | undefined {
  const o = {
    enabled: f.flow,
    maxQueue: optNum(f.flowMaxQueue),
    maxWaitMs: optNum(f.flowMaxWait),
    tenantHeader: f.flowTenantHeader,
    replicas: optNum(f.flowReplicas),
  };
  return Object.values(o).some((v) => v !== undefined) ? o : undefined;
}

/** etcd auth/TLS flags → discovery `options` (read by the etcd backend); undefined when none given. */
function etcdAuthOptions(f: ServerFlags): Record<string, unknown> | undefined {
  const o = {
    username: f.etcdUser,
    password: f.etcdPassword,
    caFile: f.etcdCa,
    certFile: f.etcdCert,
    keyFile: f.etcdKey,
  };
  return Object.values(o).some((v) => v !== undefined) ? o : undefined;
}

// long: one commander chain, one `.option` per flag; split, the flag list would be harder to read.
export function registerServer(program: Command): void {
  program
    .command("server")
    .description("OpenAI-compatible gateway and router in front of the worker fleet")
    .option("--host <host>", "address to bind (default 127.0.0.1; env INFERA_HOST)")
    .option("--port <port>", "port to listen on (default 8000; env INFERA_PORT)")
    .option("--config <file>", "YAML/JSON config file (keys of ServerConfig); flags and env win over it")
    .option("--discovery <kind>", "memory | static | etcd (default: static with --worker, else memory)")
    .option("--worker <url>", "static worker base URL (repeatable); model names from its /v1/models", collect)
    .option("--workers-file <file>", "JSON/YAML list of partial worker records (static discovery)")
    .option("--etcd <url>", "etcd endpoint (repeatable; env INFERA_ETCD)", collect)
    .option("--discovery-prefix <prefix>", "registry key prefix (default /infera)")
    .option("--etcd-user <user>", "etcd user (auth); password in INFERA_ETCD_PASSWORD")
    .option("--etcd-password <password>", "refused (argv is public): etcd password in INFERA_ETCD_PASSWORD")
    .option("--etcd-ca <file>", "CA certificate (PEM) for TLS to etcd")
    .option("--etcd-cert <file>", "client certificate (PEM) for mutual TLS to etcd")
    .option("--etcd-key <file>", "client key (PEM) for mutual TLS to etcd")
    .option(
      "--policy <name>",
      "routing policy: round-robin | kv-aware | kv-aware-classic | approx-prefix (default round-robin)",
    )
    .option("--policy-option <key=value>", "policy option (repeatable), e.g. overlapWeight=1", collect)
    .option(
      "--kv-overlap-weight <w>",
      "kv-aware: weight of prompt blocks not cached on a worker (default 2; kv-aware-classic 1)",
    )
    .option("--kv-temperature <t>", "kv-aware: softmax temperature; 0 = deterministic argmin (default 0)")
    .option(
      "--kv-balance-abs <n>",
      "kv-aware-classic/approx-prefix: imbalance when max-min load exceeds n (default 16)",
    )
    .option("--kv-balance-rel <r>", "kv-aware-classic/approx-prefix: ... and max > min × r (default 1.5)")
    .option("--router <mode>", "auto | mixed | disagg (default auto)")
    .option(
      "--http-front <front>",
      "raw (default: plain requests to the API and status routes parsed off the socket) | node (node:http for all)",
    )
    .option(
      "--api-key <key>",
      "refused (argv is public): accepted API keys in INFERA_API_KEYS (comma-separated) or `apiKeys`",
      collect,
    )
    .option("--max-body-size <bytes>", "largest request body accepted, e.g. 4MiB (default 4MiB)")
    .option(
      "--request-timeout <ms>",
      "a client's whole request must arrive within this, else 408; 0 = off (default 60000)",
    )
    .option(
      "--upstream-headers-timeout <ms>",
      "wait this long for a worker's answer headers, else 504 (default 600000)",
    )
    .option(
      "--upstream-body-timeout <ms>",
      "longest gap between a worker's answer chunks, else 504 / stream error (default 300000)",
    )
    .option(
      "--max-response-buffer <bytes>",
      "non-streamed answers held to be checked up to this size, larger relayed as they come (default 16MiB)",
    )
    .option(
      "--prompt-budget <ms>",
      "tokenizing time per request for routing; past it, routing scores the head it has (default 100)",
    )
    .option(
      "--prompt-cache-tokens <n>",
      "token ids kept of recent prompts, so a next turn tokenizes only its new text; 0 = off (default 4194304)",
    )
    .option("--metrics-public", "serve /metrics without an API key when keys are set (default: key required)")
    .option(
      "--drain-timeout <seconds>",
      "on SIGTERM: stop accepting, answer /ready 503, and let requests in flight finish for up to " +
        "this long before exiting (default 30; env INFERA_DRAIN_TIMEOUT_S)",
    )
    .option(
      "--model-gone-retry <seconds>",
      "a model whose workers all left discovery within this long is answered 503 with Retry-After " +
        "(SDKs retry), not 404 model_not_found (default 300; 0 = off; env INFERA_MODEL_GONE_RETRY_S)",
    )
    .option("--tokenizer <dir>", "model directory with tokenizer.json (default: built-in BPE)")
    .option("--scrape-interval <ms>", "engine /metrics scrape interval in ms; 0 = off (default 2000)")
    .option(
      "--scrape-idle-interval <ms>",
      "scrape interval of an idle, unchanged worker (default 20000; 0 = always --scrape-interval)",
    )
    .option(
      "--otlp-endpoint <url>",
      "OTLP/HTTP collector for request traces, e.g. http://collector:4318 (default: tracing off). " +
        "A URL with a password is refused here (argv is public): give it in INFERA_OTLP_ENDPOINT " +
        "or the config file; headers (a token) in OTEL_EXPORTER_OTLP_HEADERS",
    )
    .option("--max-retries <n>", "retries on another worker after a connection failure (default 2)")
    .option("--request-plane <kind>", "http (default; nats with --nats-url) or another registered plane")
    .option(
      "--peers <endpoints>",
      "peer replicas' announcement endpoints, tcp://host:port,... (repeatable): share routing state",
      collect,
    )
    .option("--peers-bind <endpoint>", "this replica's announcement endpoint (default tcp://127.0.0.1:*)")
    .option("--peers-secret-file <file>", "shared secret signing announcements (or INFERA_PEERS_SECRET)")
    .option(
      "--flow",
      "flow control: admission queue, priority bands, tenant fairness and limits (config `flow`)",
    )
    .option("--flow-max-queue <n>", "requests queued for admission at most, this replica (default 1000)")
    .option("--flow-max-wait <ms>", "a queued request's maximum wait before 429 (default 30000)")
    .option("--flow-tenant-header", "key flows by the x-infera-tenant header (else by API key)")
    .option(
      "--flow-replicas <n>",
      "server replicas: the per-key RPM/TPM limits are split among them; without peers, the load headroom counts own dispatches per replica (default 1)",
    )
    .option("--print-config", "print the merged, validated config as YAML (secrets as ***) and exit")
    .action(async (given: ServerFlags, cmd: Command) => {
      const { resolveServerConfig } = await import("../server/config.ts");
      const warn = (m: string) => process.stderr.write(`infera server: warning: ${m}\n`);
      // Values commander took from INFERA_* (the --nats-* options) belong to the env layer,
      // which reads them itself and names them in errors.
      const flags = { ...given } as Record<string, unknown>;
      for (const key of Object.keys(flags)) if (cmd.getOptionValueSource(key) === "env") delete flags[key];
      let config: Awaited<ReturnType<typeof resolveServerConfig>>;
      try {
        config = resolveServerConfig(() => flagsToConfig(flags as ServerFlags, { warn }), given.config, {
          warn,
          flagSource,
        });
      } catch (e) {
        if (!(e instanceof ConfigError)) throw e;
        process.stderr.write(`infera server: invalid config:\n  ${e.problems.join("\n  ")}\n`);
        process.exit(2);
      }
      if (given.printConfig) {
        const { printableConfig } = await import("../server/config-print.ts");
        process.stdout.write(printableConfig(config));
        return;
      }
      const { startServer } = await import("../server/app.ts");
      const server = await startServer(config);
      if (config.discovery.kind === "memory") {
        // Nothing outside this process can add to an in-memory registry.
        process.stderr.write(
          "note: --discovery memory starts empty here; use --worker/--workers-file (static), --discovery etcd, or `infera up`\n",
        );
      }
      process.stdout.write(`infera server listening on ${server.url}\n`);
      const graceS = config.drainTimeoutS;
      let stopping = false;
      // SIGTERM (a rolling update, kubectl delete) drains; SIGINT (Ctrl-C) stops at once.
      const stop = (sig: NodeJS.Signals) => {
        if (stopping) {
          if (sig === "SIGINT") process.exit(1);
          return;
        }
        stopping = true;
        const done = sig === "SIGTERM" ? server.drain(graceS * 1000) : server.close();
        done.then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.on("SIGINT", stop);
      process.on("SIGTERM", stop);
    });
  // NATS planes: --event-plane, --nats-url, auth and TLS (--request-plane is above).
  const server = program.commands.find((c) => c.name() === "server")!;
  addNatsOptions(server, { requestPlaneFlag: false, serverFlags: true });
  refuseArgvSecrets(server, [
    { key: "apiKey", env: "INFERA_API_KEYS", alt: "`apiKeys` in the --config file" },
    {
      key: "etcdPassword",
      env: "INFERA_ETCD_PASSWORD",
      alt: "`discovery.options.password` in the --config file",
    },
    {
      key: "etcd",
      env: "INFERA_ETCD",
      alt: "`discovery.etcdEndpoints` in the --config file",
      url: "password",
    },
    ...natsArgvSecrets(true),
  ]);
}
