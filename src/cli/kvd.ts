import { type Command, Option } from "commander";
import { envVar } from "../config/env-table.ts";
import type { KvdConfig } from "../kvd/types.ts";
import { maskUrlUserinfo, urlHasPassword } from "../util/mask.ts";

interface KvdFlags {
  socket?: string;
  tcp?: string;
  ramBytes: string;
  diskDir?: string;
  diskBytes: string;
  remote?: string;
  remoteFile?: string;
  socketGroup?: string;
  metricsPort?: string;
  metricsHost: string;
  ephemeral?: boolean;
  maxFrameBytes: string;
  tcpTokenFile?: string;
  maxQueuedBytes: string;
  maxTcpConnections?: string;
  maxTcpPerPeer: string;
  authTimeoutMs: string;
  preAuthFrameBytes: string;
}

function positiveInt(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`${name} expects a positive integer, got '${v}'`);
  return n;
}

function parseHostPort(v: string): { host: string; port: number } {
  const i = v.lastIndexOf(":");
  const port = Number(v.slice(i + 1));
  if (i <= 0 || !Number.isInteger(port) || port < 0 || port > 65535)
    throw new Error(`--tcp expects HOST:PORT, got '${v}'`);
  return { host: v.slice(0, i), port };
}

/** Where a value came from, as commander reports it (`cli`, `env`, `default`, ...). */
type ValueSource = string | undefined;

/**
 * The L4 store URL from `--remote` (or INFERA_KVD_REMOTE_URL) or `--remote-file`. A Redis URL may
 * carry a password, and argv is readable by every user of the host (`ps`, /proc/PID/cmdline):
 * a URL with a password given on the command line is refused (the message shows it masked), so
 * the secret can only arrive through the environment or a file.
 */
export function resolveKvdRemote(
  f: Pick<KvdFlags, "remote" | "remoteFile">,
  remoteSource: ValueSource,
  readFile: (path: string) => string,
): string | undefined {
  if (f.remote !== undefined && f.remoteFile !== undefined)
    throw new Error("--remote (or INFERA_KVD_REMOTE_URL) and --remote-file are exclusive");
  const url = f.remoteFile !== undefined ? readFile(f.remoteFile).trim() : f.remote;
  if (url === undefined || url === "") return undefined;
  if (remoteSource === "cli" && urlHasPassword(url))
    throw new Error(
      `--remote ${maskUrlUserinfo(url)} carries a password on the command line, where any user of ` +
        "the host can read it: pass the URL in INFERA_KVD_REMOTE_URL or a file (--remote-file)",
    );
  return url;
}

/** `infera kvd`: the tiered KV-cache daemon (RAM arena → disk → remote store). */
// long: one commander chain, one `.option` per flag; split, the flag list would be harder to read.
export function registerKvd(program: Command): void {
  program
    .command("kvd")
    .description("tiered KV-cache daemon: shared RAM arena (L2) → disk (L3) → remote store (L4)")
    .option("--socket <path>", "Unix socket path (arena fd passed over it; created 0600)")
    .option(
      "--tcp <host:port>",
      "also listen on TCP (copy path only). TCP has no file permissions to guard it: a host other " +
        "than loopback (127.0.0.1, ::1) is refused unless a token is set",
    )
    .option(
      "--tcp-token-file <file>",
      "file holding the shared secret TCP clients must send in HELLO (or env INFERA_KVD_TCP_TOKEN)",
    )
    .option("--ram-bytes <size>", "L2 arena size, e.g. 1GiB", "1GiB")
    .option("--disk-dir <dir>", "L3 directory (one checksummed file per chunk)")
    .option("--disk-bytes <size>", "L3 budget", "16GiB")
    .addOption(
      new Option(
        "--remote <url>",
        "L4 store, e.g. redis://127.0.0.1:6379/0. A URL with a password is refused here (argv is " +
          "public): give it in env INFERA_KVD_REMOTE_URL or --remote-file",
      ).env("INFERA_KVD_REMOTE_URL"),
    )
    .option("--remote-file <file>", "file holding the L4 store URL (for one with a password)")
    .option("--socket-group <group>", "make the socket 0660 and owned by this group")
    .option(
      "--metrics-port <port>",
      "serve Prometheus /metrics on this port (127.0.0.1 unless --metrics-host)",
    )
    .option("--metrics-host <host>", "metrics bind address", "127.0.0.1")
    .option("--ephemeral", "daemon-level ephemeral mode: RAM only, never writes disk or remote")
    .option(
      "--max-frame-bytes <size>",
      "largest data section one frame may carry (a larger declared size is answered 413 and the connection closed)",
      "256MiB",
    )
    .option(
      "--max-queued-bytes <size>",
      "per connection: requests read but unanswered plus replies unsent before the daemon stops reading it",
      "64MiB",
    )
    .option(
      "--max-tcp-connections <n>",
      "TCP connections open at once; more are closed at accept (default: half the open-files limit, " +
        "at most 1024; the other half is kept for Unix-socket engines)",
    )
    .option("--max-tcp-per-peer <n>", "TCP connections open at once from one address", "64")
    .option(
      "--auth-timeout-ms <ms>",
      "a TCP connection whose HELLO is not accepted in time is closed",
      "5000",
    )
    .option(
      "--pre-auth-frame-bytes <size>",
      "largest frame (meta + data) a TCP connection may send before its HELLO is accepted",
      "4KiB",
    )
    .action(async (f: KvdFlags, cmd: Command) => {
      const [{ startKvd }, { parseSize }, { createLogger }, { readFileSync }] = await Promise.all([
        import("../kvd/daemon.ts"),
        import("../kvd/size.ts"),
        import("../util/log.ts"),
        import("node:fs"),
      ]);
      const log = createLogger("kvd");
      if (!f.socket && !f.tcp) cmd.error("error: infera kvd needs --socket PATH and/or --tcp HOST:PORT");
      let cfg: KvdConfig;
      try {
        cfg = {
          socketPath: f.socket,
          tcp: f.tcp ? parseHostPort(f.tcp) : undefined,
          ramBytes: parseSize(f.ramBytes),
          diskDir: f.diskDir,
          diskBytes: parseSize(f.diskBytes),
          remoteUrl: resolveKvdRemote(f, cmd.getOptionValueSource("remote"), (p) => readFileSync(p, "utf8")),
          socketGroup: f.socketGroup,
          metricsPort: f.metricsPort !== undefined ? Number(f.metricsPort) : undefined,
          metricsHost: f.metricsHost,
          ephemeral: f.ephemeral,
          maxFrameBytes: parseSize(f.maxFrameBytes),
          maxQueuedBytes: parseSize(f.maxQueuedBytes),
          maxTcpConnections:
            f.maxTcpConnections !== undefined
              ? positiveInt("--max-tcp-connections", f.maxTcpConnections)
              : undefined,
          maxTcpPerPeer: positiveInt("--max-tcp-per-peer", f.maxTcpPerPeer),
          authTimeoutMs: positiveInt("--auth-timeout-ms", f.authTimeoutMs),
          preAuthFrameBytes: parseSize(f.preAuthFrameBytes),
          tcpToken: f.tcpTokenFile
            ? readFileSync(f.tcpTokenFile, "utf8").trim()
            : envVar("INFERA_KVD_TCP_TOKEN"),
        };
      } catch (e) {
        cmd.error(`error: ${(e as Error).message}`);
      }
      let d: Awaited<ReturnType<typeof startKvd>>;
      try {
        d = await startKvd(cfg, log);
      } catch (e) {
        log.fatal({ err: String(e) }, "kvd failed to start");
        process.exit(1);
      }
      let stopping = false;
      const stop = (sig: string) => {
        if (stopping) return;
        stopping = true;
        log.info({ signal: sig }, "kvd stopping");
        d.close().then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.on("SIGINT", () => stop("SIGINT"));
      process.on("SIGTERM", () => stop("SIGTERM"));
    });
}
