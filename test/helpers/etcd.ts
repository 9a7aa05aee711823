/**
 * Starts a real single-member etcd (/usr/bin/etcd) on free loopback ports with a temp data
 * dir, for tests and benchmarks. `stop()` (SIGTERM) / `kill()` (SIGKILL) simulate an outage;
 * `restart()` brings it back on the same ports and data, so leases and keys survive as they
 * would in production.
 */
import { type ChildProcess, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, retryOnPortRace } from "./ports.ts";
import { abandon, spawnTracked } from "./procs.ts";

export interface TlsFiles {
  caFile: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}

export interface StartEtcdOptions {
  timeoutMs?: number;
  /** Serve TLS with these files (see makeTlsFiles); `clientCertAuth` demands client certs. */
  tls?: TlsFiles & { clientCertAuth?: boolean };
}

export interface EtcdHandle {
  /** `http(s)://127.0.0.1:<client port>` */
  endpoint: string;
  clientPort: number;
  dataDir: string;
  /** Graceful stop (SIGTERM); resolves once the process exited. */
  stop(): Promise<void>;
  /** Hard stop (SIGKILL). */
  kill(): Promise<void>;
  /** Starts it again on the same ports and data dir; resolves once it answers. */
  restart(): Promise<void>;
  /** Stops it and removes the data dir. */
  dispose(): Promise<void>;
}

const ETCD_BIN = process.env.INFERA_ETCD_BIN ?? "/usr/bin/etcd";

function httpsHealth(endpoint: string, tls: TlsFiles): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request(
      `${endpoint}/health`,
      {
        ca: readFileSync(tls.caFile),
        cert: readFileSync(tls.clientCert),
        key: readFileSync(tls.clientKey),
        timeout: 500,
      },
      (res) => {
        let body = "";
        res.on("data", (d: Buffer) => {
          body += d.toString();
        });
        res.on("end", () => resolve(res.statusCode === 200 && body.includes('"true"')));
      },
    );
    req.on("error", () => resolve(false));
    req.on("timeout", () => req.destroy());
    req.end();
  });
}

async function waitHealthy(
  endpoint: string,
  timeoutMs: number,
  proc: ChildProcess,
  tls?: TlsFiles,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`etcd exited with ${proc.exitCode} before it was healthy`);
    try {
      if (tls) {
        if (await httpsHealth(endpoint, tls)) return;
      } else {
        const res = await fetch(`${endpoint}/health`, { signal: AbortSignal.timeout(500) });
        if (res.ok) {
          const body = (await res.json()) as { health?: string };
          if (body.health === "true") return;
        }
      }
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`etcd at ${endpoint} not healthy after ${timeoutMs} ms`);
}

function exited(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => proc.once("exit", () => resolve()));
}

/** Starts etcd on free ports; a start that lost a port to another process is retried on new ones. */
export function startEtcd(opts: StartEtcdOptions = {}): Promise<EtcdHandle> {
  return retryOnPortRace(() => startEtcdOnce(opts));
}

async function startEtcdOnce(opts: StartEtcdOptions): Promise<EtcdHandle> {
  const clientPort = await freePort();
  const peerPort = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), "infera-etcd-"));
  const endpoint = `${opts.tls ? "https" : "http"}://127.0.0.1:${clientPort}`;
  const tlsArgs = opts.tls
    ? [
        "--cert-file",
        opts.tls.serverCert,
        "--key-file",
        opts.tls.serverKey,
        "--trusted-ca-file",
        opts.tls.caFile,
        ...(opts.tls.clientCertAuth ? ["--client-cert-auth"] : []),
      ]
    : [];
  const peer = `http://127.0.0.1:${peerPort}`;
  let proc: ChildProcess | null = null;

  const launch = async (): Promise<void> => {
    // Tracked: not left running if the test or bench process exits without disposing of it.
    const p = spawnTracked(
      ETCD_BIN,
      [
        "--name",
        "infera-test",
        "--data-dir",
        dataDir,
        "--listen-client-urls",
        endpoint,
        "--advertise-client-urls",
        endpoint,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        `infera-test=${peer}`,
        "--log-level",
        "error",
        "--logger",
        "zap",
        ...tlsArgs,
      ],
      { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ETCD_UNSUPPORTED_ARCH: process.arch } },
    );
    let stderr = "";
    p.stderr?.on("data", (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    proc = p;
    try {
      await waitHealthy(endpoint, opts.timeoutMs ?? 15_000, p, opts.tls);
    } catch (err) {
      await abandon(p);
      throw new Error(`${(err as Error).message}\n${stderr}`);
    }
  };

  const halt = async (signal: NodeJS.Signals): Promise<void> => {
    const p = proc;
    proc = null;
    if (!p) return;
    p.kill(signal);
    await exited(p);
  };

  await launch();
  return {
    endpoint,
    clientPort,
    dataDir,
    stop: () => halt("SIGTERM"),
    kill: () => halt("SIGKILL"),
    restart: async () => {
      await halt("SIGTERM");
      await launch();
    },
    dispose: async () => {
      await halt("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** Runs etcdctl against a plain-HTTP etcd (e.g. to add users and enable auth). */
export function etcdctl(endpoint: string, args: string[]): string {
  return execFileSync("/usr/bin/etcdctl", ["--endpoints", endpoint, ...args], {
    env: { ...process.env, ETCDCTL_API: "3" },
    stdio: ["ignore", "pipe", "pipe"],
  }).toString();
}

/** A throwaway CA, a server cert for 127.0.0.1 and a client cert, made with openssl. */
export function makeTlsFiles(dir: string): TlsFiles {
  const f = (n: string) => join(dir, n);
  const ssl = (args: string[]) => execFileSync("openssl", args, { stdio: "ignore" });
  ssl([
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    f("ca.key"),
    "-out",
    f("ca.crt"),
    "-days",
    "1",
    "-subj",
    "/CN=infera-test-ca",
  ]);
  const issue = (name: string, usage: string) => {
    writeFileSync(f(`${name}.ext`), `subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=${usage}\n`);
    ssl([
      "req",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-keyout",
      f(`${name}.key`),
      "-out",
      f(`${name}.csr`),
      "-subj",
      `/CN=${name}`,
    ]);
    ssl([
      "x509",
      "-req",
      "-in",
      f(`${name}.csr`),
      "-CA",
      f("ca.crt"),
      "-CAkey",
      f("ca.key"),
      "-CAcreateserial",
      "-out",
      f(`${name}.crt`),
      "-days",
      "1",
      "-extfile",
      f(`${name}.ext`),
    ]);
  };
  issue("server", "serverAuth,clientAuth");
  issue("client", "clientAuth");
  return {
    caFile: f("ca.crt"),
    serverCert: f("server.crt"),
    serverKey: f("server.key"),
    clientCert: f("client.crt"),
    clientKey: f("client.key"),
  };
}
