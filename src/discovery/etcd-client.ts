/**
 * etcd connection settings shared by the watcher (server side) and the registrar (launcher
 * side): endpoints as a list, user/password auth, TLS files, and fault handling tuned so
 * that an etcd outage is noticed quickly and recovery is not held back by the client's
 * default circuit breaker (5 s open after 3 failures) — our own loops retry with backoff.
 */

import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { Etcd3, type IOptions, isRecoverableError } from "etcd3";
import { envVar } from "../config/env-table.ts";
import { BadRequestError } from "../protocol/errors.ts";
import { parseWorkerRecordText } from "./schema.ts";
import type { WorkerRecord } from "./types.ts";

export interface EtcdOptions {
  /** e.g. ["http://10.0.0.1:2379", "https://etcd-2:2379"]; scheme picks TLS when no CA given. */
  endpoints: string[];
  /** Key prefix; records live under `<prefix>/workers/`. Default "/infera". */
  prefix?: string;
  username?: string;
  password?: string;
  /** PEM files for TLS: CA (enables TLS), client cert and key (mutual TLS). */
  caFile?: string;
  certFile?: string;
  keyFile?: string;
  /** Deadline for unary calls (get/put/grant/revoke), ms. Default 5000. */
  callTimeoutMs?: number;
  /**
   * Largest gRPC message the client accepts, bytes. Default 256 MiB: grpc-js's own default
   * (4 MiB) turned a watch catch-up or an unpaged list of ~1,000 records of 4 KB into
   * RESOURCE_EXHAUSTED, i.e. a discovery that never lists. Lists are paged as well.
   */
  maxReceiveBytes?: number;
}

export const DEFAULT_ETCD_MAX_RECEIVE_BYTES = 256 * 1024 * 1024;

export const DEFAULT_ETCD_PREFIX = "/infera";

/** Retry delays of the watcher's re-list and the registrar's re-grant loops. */
export interface Backoff {
  initialMs: number;
  maxMs: number;
}
export const DEFAULT_BACKOFF: Backoff = { initialMs: 100, maxMs: 2000 };

/** Background retry delays do not keep the process alive. */
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms).unref());

export function errText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

type FaultHandling = NonNullable<IOptions["faultHandling"]>;
type Policy = NonNullable<FaultHandling["global"]>;

/**
 * Host policy: just run the call, so errors surface at once and our own loops decide when
 * to retry (the default breaker keeps failing for 5 s after etcd is back).
 */
function passthroughPolicy(): Policy {
  const policy = {
    execute: <T>(fn: (ctx: unknown) => Promise<T> | T) => Promise.resolve().then(() => fn({})),
  };
  return policy as unknown as Policy;
}

/**
 * Global policy: fail over. Each attempt takes the next host of the client's shuffled
 * endpoint list, so `hosts` attempts try every endpoint once per call.
 */
function failoverPolicy(hosts: number): Policy {
  const policy = {
    execute: async <T>(fn: (ctx: unknown) => Promise<T> | T): Promise<T> => {
      let last: unknown;
      for (let i = 0; i < Math.max(1, hosts); i++) {
        try {
          return await fn({});
        } catch (err) {
          last = err;
          if (!(err instanceof Error) || !isRecoverableError(err)) throw err;
        }
      }
      throw last;
    },
  };
  return policy as unknown as Policy;
}

export function normalizePrefix(prefix: string | undefined): string {
  const p = (prefix ?? DEFAULT_ETCD_PREFIX).trim();
  if (p === "" || p === "/") return "";
  return (p.startsWith("/") ? p : `/${p}`).replace(/\/+$/, "");
}

export function workersPrefix(prefix: string | undefined): string {
  return `${normalizePrefix(prefix)}/workers/`;
}

/** Accepts "a:2379,b:2379" or a list; strips blanks. */
export function parseEndpoints(value: string | string[] | undefined): string[] {
  const items = Array.isArray(value) ? value : (value ?? "").split(",");
  const out = items.flatMap((v) => v.split(",")).map((v) => v.trim());
  return out.filter((v) => v.length > 0);
}

/**
 * Endpoints without userinfo, and the credentials one carried (`http://user:pass@host:2379`):
 * gRPC would take the userinfo as part of the host name (and echo it in every error), so it is
 * used as etcd auth instead, unless a user is given otherwise.
 */
export function splitEndpointCredentials(endpoints: readonly string[]): {
  hosts: string[];
  username?: string;
  password?: string;
} {
  let username: string | undefined;
  let password: string | undefined;
  const hosts = endpoints.map((e) => {
    const m = /^([a-z][a-z0-9+.-]*:\/\/)([^/@]*)@(.*)$/i.exec(e);
    if (!m) return e;
    const [user, pass] = m[2]!.split(/:(.*)/s, 2);
    username ??= decodeURIComponent(user ?? "");
    if (pass !== undefined) password ??= decodeURIComponent(pass);
    return `${m[1]}${m[3]}`;
  });
  return { hosts, username, password };
}

export function createEtcdClient(opts: EtcdOptions): Etcd3 {
  if (opts.endpoints.length === 0) throw new BadRequestError("etcd: at least one endpoint is required");
  const fromUrl = splitEndpointCredentials(opts.endpoints);
  if (opts.username === undefined && fromUrl.username) {
    opts = { ...opts, username: fromUrl.username, password: opts.password ?? fromUrl.password };
  }
  opts = { ...opts, endpoints: fromUrl.hosts };
  const useTls = opts.caFile !== undefined || opts.endpoints.some((e) => e.startsWith("https://"));
  const options: IOptions = {
    hosts: opts.endpoints,
    dialTimeout: 3000,
    faultHandling: {
      host: () => passthroughPolicy(),
      global: failoverPolicy(opts.endpoints.length),
    },
    grpcOptions: {
      // Reconnect quickly after an outage; find dead peers on idle streams.
      "grpc.initial_reconnect_backoff_ms": 200,
      "grpc.max_reconnect_backoff_ms": 1000,
      "grpc.keepalive_time_ms": 10_000,
      "grpc.keepalive_timeout_ms": 5000,
      "grpc.max_receive_message_length": opts.maxReceiveBytes ?? DEFAULT_ETCD_MAX_RECEIVE_BYTES,
    },
    defaultCallOptions: (ctx) =>
      ctx.isStream ? {} : { deadline: Date.now() + (opts.callTimeoutMs ?? 5000) },
  };
  if (useTls) {
    options.credentials = {
      rootCertificate: opts.caFile ? readFileSync(opts.caFile) : (undefined as unknown as Buffer),
      ...(opts.keyFile ? { privateKey: readFileSync(opts.keyFile) } : {}),
      ...(opts.certFile ? { certChain: readFileSync(opts.certFile) } : {}),
    };
  }
  if (opts.username !== undefined) {
    options.auth = { username: opts.username, password: opts.password ?? "" };
  }
  return new Etcd3(options);
}

/** Adds the etcd flags to a command (server and launchers use the same names). */
export function addEtcdFlags(cmd: Command): Command {
  return cmd
    .option(
      "--etcd-endpoints <list>",
      "comma-separated etcd endpoints",
      envVar("INFERA_ETCD_ENDPOINTS") ?? envVar("INFERA_ETCD") ?? "http://127.0.0.1:2379",
    )
    .option(
      "--etcd <url>",
      "etcd endpoint (repeatable; same as the server's flag; wins over --etcd-endpoints)",
      collect,
    )
    .option("--etcd-prefix <prefix>", "etcd key prefix", envVar("INFERA_ETCD_PREFIX") ?? DEFAULT_ETCD_PREFIX)
    .option("--etcd-user <user>", "etcd user name (auth)", envVar("INFERA_ETCD_USER"))
    .option("--etcd-password <password>", "refused (argv is public): etcd password in INFERA_ETCD_PASSWORD")
    .option("--etcd-ca <file>", "CA certificate (PEM) for TLS to etcd")
    .option("--etcd-cert <file>", "client certificate (PEM) for mutual TLS")
    .option("--etcd-key <file>", "client key (PEM) for mutual TLS");
}

const collect = (v: string, prev: string[] | undefined): string[] => [...(prev ?? []), v];

export interface EtcdFlagValues {
  etcd?: string[];
  etcdEndpoints?: string;
  etcdPrefix?: string;
  etcdUser?: string;
  etcdPassword?: string;
  etcdCa?: string;
  etcdCert?: string;
  etcdKey?: string;
}

export function etcdOptionsFromFlags(flags: EtcdFlagValues): EtcdOptions {
  return {
    endpoints: parseEndpoints(flags.etcd && flags.etcd.length > 0 ? flags.etcd : flags.etcdEndpoints),
    prefix: flags.etcdPrefix,
    username: flags.etcdUser,
    password: flags.etcdPassword ?? envVar("INFERA_ETCD_PASSWORD"),
    caFile: flags.etcdCa,
    certFile: flags.etcdCert,
    keyFile: flags.etcdKey,
  };
}

/** Parses and validates a stored record (schema.ts); null for anything invalid. */
export function parseWorkerRecord(raw: string): WorkerRecord | null {
  const r = parseWorkerRecordText(raw);
  return r.ok ? r.record : null;
}
