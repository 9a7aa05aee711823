/**
 * One place that turns Infera's NATS settings (URL, token / user+password / nkey, TLS) into a
 * live connection. Server and launcher both use it, so auth and TLS behave the same on both ends.
 * Reconnects forever by default: a broker restart must not take a server or agent down.
 */
import { readFileSync } from "node:fs";
import {
  type Authenticator,
  connect,
  type NatsConnection,
  type NodeConnectionOptions,
  nkeyAuthenticator,
} from "@nats-io/transport-node";
import { Gauge, type Registry } from "prom-client";
import { createLogger, type Logger } from "../../util/log.ts";
import { maskUrlUserinfo } from "../../util/mask.ts";

export interface NatsTlsOptions {
  /** CA bundle (PEM file) that signed the server's certificate. */
  caFile?: string;
  /** Client certificate (PEM file), when the server verifies clients. */
  certFile?: string;
  /** Client key (PEM file). */
  keyFile?: string;
  /** Defaults to true; false only for test setups with certificates that do not match the host. */
  rejectUnauthorized?: boolean;
}

export interface NatsConnectOptions {
  /** One URL or several, comma-separated: `nats://10.0.0.2:4222,nats://10.0.0.3:4222`. `tls://` forces TLS. */
  url: string;
  token?: string;
  user?: string;
  password?: string;
  /** An nkey user seed (`SU...`), given directly... */
  nkeySeed?: string;
  /** ...or read from a file (preferred: keeps the seed out of process listings). */
  nkeySeedFile?: string;
  tls?: NatsTlsOptions;
  /** Shown in the server's monitoring pages. */
  name?: string;
  /** Milliseconds between reconnect attempts (default 250: brokers restart quickly). */
  reconnectTimeWaitMs?: number;
  /** Max reconnect attempts per server; -1 (default) = forever. */
  maxReconnectAttempts?: number;
  /** Handshake timeout for the first connect (default 5000 ms). */
  connectTimeoutMs?: number;
  /**
   * Server request plane only (not a connect option): how long a request without a response
   * head waits for a lost connection to come back before it fails (default 10000 ms; 0 = at
   * once). `--nats-reconnect-wait-ms` / INFERA_NATS_RECONNECT_WAIT_MS.
   */
  reconnectWaitMs?: number;
  /**
   * A broker that takes clients without auth is intended (a laptop, a test): no warning.
   * `--nats-allow-anonymous` / INFERA_NATS_ALLOW_ANONYMOUS.
   */
  allowAnonymous?: boolean;
  /** Where `infera_nats_anonymous` is set (the service's registry). */
  registry?: Registry;
  logger?: Logger;
}

/** The options carry some credential (token, user, nkey, or userinfo in a URL). */
export function hasNatsCredentials(opts: NatsConnectOptions): boolean {
  if (opts.token || opts.user || opts.nkeySeed || opts.nkeySeedFile) return true;
  return opts.url.split(",").some((u) => /^[a-z]+:\/\/[^/@]+@/i.test(u.trim()));
}

const anonymousGauges = new WeakMap<Registry, Gauge>();
const warnedLoggers = new WeakSet<Logger>();

function anonymousGauge(registry: Registry): Gauge {
  let g = anonymousGauges.get(registry);
  if (!g) {
    g = new Gauge({
      name: "infera_nats_anonymous",
      help:
        "1 when this process connected to NATS without auth or to a broker that takes clients " +
        "without auth: anyone on the network can read prompts and forge answers and KV events",
      registers: [registry],
    });
    anonymousGauges.set(registry, g);
  }
  return g;
}

/**
 * Warns (once per logger) and sets the gauge when the connection is unauthenticated: no
 * credential given, or the broker's INFO says it does not require auth (nats-server sets
 * `AuthRequired` only when users, nkeys, a user/token or a callout are configured:
 * nats-io/nats-server server/auth.go @ 1787eee035cf0253c201fa0f05afad92b6f296dc,
 * Server.configureAuthorization).
 */
export function checkNatsAuth(
  opts: NatsConnectOptions,
  authRequired: boolean | undefined,
  log: Logger,
): boolean {
  const anonymous = !hasNatsCredentials(opts) || authRequired !== true;
  if (opts.registry) anonymousGauge(opts.registry).set(anonymous ? 1 : 0);
  if (anonymous && !opts.allowAnonymous && !warnedLoggers.has(log)) {
    warnedLoggers.add(log);
    log.warn(
      {
        url: maskUrlUserinfo(opts.url),
        credentials: hasNatsCredentials(opts),
        brokerRequiresAuth: authRequired === true,
      },
      "NATS connection without authentication: anyone who reaches this broker can read prompts, " +
        "answer requests and forge KV events. Configure NATS users (docs/deploy-kubernetes.md, " +
        "NATS identities), or pass --nats-allow-anonymous if this is intended",
    );
  }
  return anonymous;
}

/** Builds the transport-node options; split out so tests can check what is passed through. */
export function buildConnectionOptions(opts: NatsConnectOptions): NodeConnectionOptions {
  const servers = opts.url
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
  if (servers.length === 0) throw new Error("NATS URL is empty");
  const out: NodeConnectionOptions = {
    servers,
    name: opts.name,
    reconnect: true,
    maxReconnectAttempts: opts.maxReconnectAttempts ?? -1,
    reconnectTimeWait: opts.reconnectTimeWaitMs ?? 250,
    reconnectJitter: 50,
    timeout: opts.connectTimeoutMs ?? 5000,
    // A broker that is down at start should not fail the process: keep trying like a reconnect.
    waitOnFirstConnect: false,
    ignoreClusterUpdates: false,
  };
  const authenticators: Authenticator[] = [];
  if (opts.token !== undefined && opts.token !== "") out.token = opts.token;
  if (opts.user !== undefined && opts.user !== "") {
    out.user = opts.user;
    out.pass = opts.password ?? "";
  }
  const seed =
    opts.nkeySeed ?? (opts.nkeySeedFile ? readFileSync(opts.nkeySeedFile, "utf8").trim() : undefined);
  if (seed !== undefined && seed !== "") {
    authenticators.push(nkeyAuthenticator(new TextEncoder().encode(seed)));
  }
  if (authenticators.length > 0) out.authenticator = authenticators;
  const tlsWanted = opts.tls !== undefined || servers.some((s) => s.startsWith("tls://"));
  if (tlsWanted) {
    const tls = opts.tls ?? {};
    out.tls = {
      caFile: tls.caFile,
      certFile: tls.certFile,
      keyFile: tls.keyFile,
      rejectUnauthorized: tls.rejectUnauthorized ?? true,
    };
  }
  return out;
}

/**
 * Connects and logs connection state changes (disconnect / reconnect) for operators.
 * Rejects when the first connect fails (bad auth, TLS mismatch, nothing listening).
 */
export async function connectNats(opts: NatsConnectOptions): Promise<NatsConnection> {
  const log = opts.logger ?? createLogger("nats");
  const nc = await connect(buildConnectionOptions(opts));
  checkNatsAuth(opts, nc.info?.auth_required, log);
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") log.warn({ server: maskUrlUserinfo(s.server) }, "nats disconnected");
      else if (s.type === "reconnect") log.info({ server: maskUrlUserinfo(s.server) }, "nats reconnected");
      else if (s.type === "error") log.warn({ err: s.error.message }, "nats error");
    }
  })().catch(() => {});
  return nc;
}
