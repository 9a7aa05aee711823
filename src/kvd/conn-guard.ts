/**
 * kvd's limits on TCP connections before and around authentication (issue #30 item 4). A TCP
 * peer that has not (yet) authenticated must not be able to make the daemon allocate large
 * frames, hold connections open for ever, or take the file descriptors that the engines on
 * this host need for their Unix-socket handshakes. So:
 *
 * - TCP connections are capped in all and per peer address; a connection over a cap is closed
 *   right after accept (its fd comes back at once). Unix-socket connections are never counted
 *   or capped: the default total cap is half the process's open-files limit, and the other half
 *   is the reserve that keeps local engines served (and disk files openable).
 * - The first frame of a TCP connection (its HELLO) may be at most `preAuthFrameBytes`, and the
 *   HELLO must be accepted within `authTimeoutMs` (both enforced in server.ts).
 * - Every refusal is counted by reason (kvd_tcp_refused_total) and warned about, at most once
 *   per reason every WARN_EVERY_MS with the number suppressed in between, so a flood cannot
 *   flood the log too.
 */
import { readFileSync } from "node:fs";
import type net from "node:net";
import type { Logger } from "../util/log.ts";

export type RefusalReason = "total_cap" | "peer_cap" | "auth_timeout" | "preauth_frame" | "bad_token";
export const REFUSAL_REASONS: readonly RefusalReason[] = [
  "total_cap",
  "peer_cap",
  "auth_timeout",
  "preauth_frame",
  "bad_token",
];

export const DEFAULT_AUTH_TIMEOUT_MS = 5000;
export const DEFAULT_PRE_AUTH_FRAME_BYTES = 4096;
export const DEFAULT_MAX_TCP_PER_PEER = 64;
const MAX_TCP_CEILING = 1024;
const WARN_EVERY_MS = 10_000;

/** The soft RLIMIT_NOFILE of this process (Linux, from /proc/self/limits); undefined elsewhere. */
export function openFilesLimit(): number | undefined {
  try {
    const line = readFileSync("/proc/self/limits", "utf8")
      .split("\n")
      .find((l) => l.startsWith("Max open files"));
    const soft = line?.slice("Max open files".length).trim().split(/\s+/)[0];
    const n = Number(soft);
    return soft === "unlimited" ? Number.POSITIVE_INFINITY : Number.isFinite(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

/** Half the open-files limit (the other half is the Unix-socket reserve), at most 1024. */
export function defaultMaxTcpConnections(nofile = openFilesLimit()): number {
  if (nofile === undefined) return MAX_TCP_CEILING;
  return Math.max(1, Math.min(MAX_TCP_CEILING, Math.floor(nofile / 2)));
}

export interface ConnLimits {
  maxTcpConnections: number;
  maxTcpPerPeer: number;
  authTimeoutMs: number;
  preAuthFrameBytes: number;
}

export class ConnGuard {
  readonly limits: ConnLimits;
  private readonly log: Logger;
  /** Open TCP connections admitted. */
  tcp = 0;
  private readonly perPeer = new Map<string, number>();
  readonly refused: Record<RefusalReason, number> = {
    total_cap: 0,
    peer_cap: 0,
    auth_timeout: 0,
    preauth_frame: 0,
    bad_token: 0,
  };
  private readonly lastWarn = new Map<RefusalReason, { at: number; suppressed: number }>();

  constructor(limits: ConnLimits, log: Logger) {
    this.limits = limits;
    this.log = log;
  }

  /** Admits a new TCP connection, or closes it at once and counts why; true when admitted. */
  admit(sock: net.Socket): boolean {
    const peer = sock.remoteAddress ?? "unknown";
    const mine = this.perPeer.get(peer) ?? 0;
    const reason: RefusalReason | null =
      this.tcp >= this.limits.maxTcpConnections
        ? "total_cap"
        : mine >= this.limits.maxTcpPerPeer
          ? "peer_cap"
          : null;
    if (reason) {
      sock.on("error", () => {});
      sock.destroy();
      this.refuse(reason, peer);
      return false;
    }
    this.tcp++;
    this.perPeer.set(peer, mine + 1);
    sock.once("close", () => {
      this.tcp--;
      const n = (this.perPeer.get(peer) ?? 1) - 1;
      if (n <= 0) this.perPeer.delete(peer);
      else this.perPeer.set(peer, n);
    });
    return true;
  }

  /** Counts a refusal and warns (rate-limited per reason). */
  refuse(reason: RefusalReason, peer: string | undefined): void {
    this.refused[reason]++;
    const now = Date.now();
    const w = this.lastWarn.get(reason);
    if (w && now - w.at < WARN_EVERY_MS) {
      w.suppressed++;
      return;
    }
    this.lastWarn.set(reason, { at: now, suppressed: 0 });
    this.log.warn(
      {
        reason,
        peer,
        suppressedSinceLastWarning: w?.suppressed ?? 0,
        totalRefused: this.refused[reason],
        tcpConnections: this.tcp,
        limits: this.limits,
      },
      "kvd refused or closed an unauthenticated TCP connection",
    );
  }
}
