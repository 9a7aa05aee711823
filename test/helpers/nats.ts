/**
 * Starts a real nats-server (Debian's /usr/sbin/nats-server) on a free 127.0.0.1 port with its
 * own temp dir, for tests and benches. Supports token, user/password and nkey auth, and TLS
 * (certificates made on the fly with openssl). `restart()` brings it back on the same port.
 */
import { type ChildProcess, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, isPortRace } from "./ports.ts";
import { spawnTracked, startedOrStopped } from "./procs.ts";

export const NATS_SERVER_BIN = process.env.NATS_SERVER_BIN ?? "/usr/sbin/nats-server";

export interface StartNatsOptions {
  token?: string;
  user?: string;
  password?: string;
  /** Public nkey (`U...`) of a user allowed in. */
  nkeyPublic?: string;
  /** Serve TLS with a self-signed CA made in the temp dir; its files are returned. */
  tls?: boolean;
  /** With tls: also require client certificates signed by that CA (mutual TLS). */
  tlsVerify?: boolean;
  /**
   * A whole `authorization { ... }` block (e.g. taken from a rendered nats.conf), instead of
   * token/user/nkey; its `$VAR`s come from `env`.
   */
  authorization?: string;
  /** Start-up limit: until nats-server logs "Server is ready" (default 20 s). */
  timeoutMs?: number;
  /** Environment of the nats-server process (the rendered NATS container's env). */
  env?: Record<string, string>;
}

export interface TlsFiles {
  caFile: string;
  certFile: string;
  keyFile: string;
  /** A client certificate and key signed by the same CA (for mutual TLS). */
  clientCertFile: string;
  clientKeyFile: string;
}

export interface NatsServerHandle {
  url: string;
  port: number;
  dir: string;
  tls?: TlsFiles;
  /** Graceful stop (SIGTERM), waits for exit. */
  stop(): Promise<void>;
  /** SIGKILL, waits for exit. */
  kill(): Promise<void>;
  /** Stops (if running) and starts again on the same port and config. */
  restart(): Promise<void>;
  /** Stops and removes the temp dir. */
  close(): Promise<void>;
}

function makeTls(dir: string): TlsFiles {
  const caKey = join(dir, "ca.key");
  const caFile = join(dir, "ca.pem");
  const keyFile = join(dir, "server.key");
  const csr = join(dir, "server.csr");
  const certFile = join(dir, "server.pem");
  const ext = join(dir, "ext.cnf");
  const q = { stdio: "ignore" as const };
  /** Signs a CSR with the test CA (2 days, SHA-256). */
  const sign = (req: string, out: string, extra: string[] = []) =>
    execFileSync(
      "openssl",
      [
        "x509",
        "-req",
        "-in",
        req,
        "-CA",
        caFile,
        "-CAkey",
        caKey,
        "-CAcreateserial",
        "-days",
        "2",
        "-sha256",
        ...extra,
        "-out",
        out,
      ],
      q,
    );
  execFileSync("openssl", ["genrsa", "-out", caKey, "2048"], q);
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-new",
      "-key",
      caKey,
      "-sha256",
      "-days",
      "2",
      "-subj",
      "/CN=infera-test-ca",
      "-out",
      caFile,
    ],
    q,
  );
  execFileSync("openssl", ["genrsa", "-out", keyFile, "2048"], q);
  execFileSync("openssl", ["req", "-new", "-key", keyFile, "-subj", "/CN=127.0.0.1", "-out", csr], q);
  writeFileSync(ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  sign(csr, certFile, ["-extfile", ext]);
  const clientKeyFile = join(dir, "client.key");
  const clientCsr = join(dir, "client.csr");
  const clientCertFile = join(dir, "client.pem");
  execFileSync("openssl", ["genrsa", "-out", clientKeyFile, "2048"], q);
  execFileSync(
    "openssl",
    ["req", "-new", "-key", clientKeyFile, "-subj", "/CN=infera-client", "-out", clientCsr],
    q,
  );
  sign(clientCsr, clientCertFile);
  return { caFile, certFile, keyFile, clientCertFile, clientKeyFile };
}

function configText(port: number, o: StartNatsOptions, tls: TlsFiles | undefined): string {
  const lines = [`listen: "127.0.0.1:${port}"`, "max_payload: 1048576"];
  if (o.authorization) lines.push(o.authorization);
  else if (o.token) lines.push(`authorization { token: ${JSON.stringify(o.token)} }`);
  else if (o.user) {
    lines.push(
      `authorization { user: ${JSON.stringify(o.user)}, password: ${JSON.stringify(o.password ?? "")} }`,
    );
  } else if (o.nkeyPublic)
    lines.push(`authorization { users: [ { nkey: ${JSON.stringify(o.nkeyPublic)} } ] }`);
  if (tls) {
    const verify = o.tlsVerify ? `, ca_file: ${JSON.stringify(tls.caFile)}, verify: true` : "";
    lines.push(
      `tls { cert_file: ${JSON.stringify(tls.certFile)}, key_file: ${JSON.stringify(tls.keyFile)}${verify} }`,
    );
  }
  return `${lines.join("\n")}\n`;
}

function waitReady(child: ChildProcess, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`nats-server not ready after ${timeoutMs} ms: ${out.slice(-500)}`));
    }, timeoutMs);
    const onData = (d: Buffer) => {
      out += d.toString();
      if (out.includes("Server is ready")) {
        cleanup();
        resolve();
      }
    };
    const onExit = (code: number | null) => {
      cleanup();
      reject(new Error(`nats-server exited (${code}) before ready: ${out.slice(-500)}`));
    };
    const cleanup = () => {
      clearTimeout(timer);
      child.stderr?.off("data", onData);
      child.off("exit", onExit);
    };
    child.stderr?.on("data", onData);
    child.on("exit", onExit);
  });
}

function waitExit(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

/** The `authorization { ... }` block of a nats.conf (up to its closing brace at column 0). */
export function authorizationBlock(conf: string): string {
  const start = conf.indexOf("authorization {");
  if (start < 0) throw new Error("no authorization block");
  const end = conf.indexOf("\n}", start);
  return conf.slice(start, end + 2);
}

export async function startNats(o: StartNatsOptions = {}): Promise<NatsServerHandle> {
  const dir = mkdtempSync(join(tmpdir(), "infera-nats-"));
  let port = await freePort();
  const tls = o.tls ? makeTls(dir) : undefined;
  const conf = join(dir, "nats.conf");
  writeFileSync(conf, configText(port, o, tls));
  let child: ChildProcess | undefined;

  const launch = async () => {
    const c = spawnTracked(NATS_SERVER_BIN, ["-c", conf], {
      stdio: ["ignore", "ignore", "pipe"],
      ...(o.env ? { env: { ...process.env, ...o.env } } : {}),
    });
    child = c;
    // Keep draining stderr so the pipe never fills and blocks the server.
    c.stderr?.on("data", () => {});
    // A start that times out (or loses its port) must not leave the server running.
    await startedOrStopped(c, () => waitReady(c, o.timeoutMs ?? 20_000));
  };
  const stopWith = async (sig: NodeJS.Signals) => {
    const c = child;
    child = undefined;
    if (!c) return;
    c.kill(sig);
    await waitExit(c);
  };
  // A port free a moment ago can be taken before the server binds it (another test process
  // picked it too): start again on a new one.
  for (let attempt = 1; ; attempt++) {
    try {
      await launch();
      break;
    } catch (err) {
      if (!isPortRace(err) || attempt === 3) throw err;
      port = await freePort();
      writeFileSync(conf, configText(port, o, tls));
    }
  }
  const scheme = tls ? "tls" : "nats";
  return {
    url: `${scheme}://127.0.0.1:${port}`,
    port,
    dir,
    tls,
    stop: () => stopWith("SIGTERM"),
    kill: () => stopWith("SIGKILL"),
    restart: async () => {
      await stopWith("SIGTERM");
      await launch();
    },
    close: async () => {
      await stopWith("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
