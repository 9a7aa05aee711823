/**
 * A real `infera kvd` process with a TCP token, and the attack shapes of issue #30 item 4
 * (large pre-auth HELLO frames, idle unauthenticated connections): shared by
 * test/kvd/conn-guard.test.ts and test/reliability/kvd-preauth.test.ts.
 */
import type { ChildProcess } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import { encodeFrame, type Frame, FrameDecoder, Op } from "../../src/kvd/protocol.ts";
import { freePort } from "../helpers/ports.ts";
import { spawnTracked, startedOrStopped } from "../helpers/procs.ts";
import { KVD_START_MS, MiB, waitExit } from "./helpers.ts";

export { MiB };

export const TOKEN = "preauth-test-token";

export interface Kvd {
  child: ChildProcess;
  socket: string;
  tcpPort: number;
  metricsPort: number;
}

/**
 * `infera kvd` as a child process (optionally under an open-files limit), TCP with a token. A
 * start that fails or times out stops the process before it throws.
 */
export async function startKvdProcess(
  dir: string,
  extra: string[],
  nofile?: number,
  timeoutMs = KVD_START_MS,
): Promise<Kvd> {
  const socket = join(dir, "kvd.sock");
  const tokenFile = join(dir, "token");
  writeFileSync(tokenFile, TOKEN, { mode: 0o600 });
  const tcpPort = await freePort();
  const metricsPort = await freePort();
  const args = [
    join(import.meta.dirname, "../../bin/infera.js"),
    "kvd",
    "--socket",
    socket,
    "--tcp",
    `127.0.0.1:${tcpPort}`,
    "--tcp-token-file",
    tokenFile,
    "--metrics-port",
    String(metricsPort),
    "--ram-bytes",
    "16MiB",
    "--ephemeral",
    ...extra,
  ];
  const [cmd, argv] = nofile
    ? ["prlimit", [`--nofile=${nofile}:${nofile}`, "--", process.execPath, ...args]]
    : [process.execPath, args];
  const child = spawnTracked(cmd as string, argv as string[], {
    env: { ...process.env, INFERA_LOG_LEVEL: "silent" },
    stdio: ["ignore", "ignore", "inherit"],
  });
  const deadline = Date.now() + timeoutMs;
  await startedOrStopped(child, async () => {
    // The metrics listener too: it opens after the TCP one, and tests read it at once
    // (ECONNREFUSED on the metrics port seen on a loaded box).
    while (!existsSync(socket) || !(await canConnect(tcpPort)) || !(await canConnect(metricsPort))) {
      if (child.exitCode !== null) throw new Error(`kvd exited with ${child.exitCode}`);
      if (Date.now() > deadline) throw new Error("kvd did not start in time");
      await new Promise((r) => setTimeout(r, 50));
    }
  });
  return { child, socket, tcpPort, metricsPort };
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1", () => {
      s.destroy();
      resolve(true);
    });
    s.on("error", () => resolve(false));
  });
}

export async function stopKvdProcess(k: Kvd | undefined): Promise<void> {
  if (!k || k.child.exitCode !== null) return;
  k.child.kill("SIGKILL");
  await waitExit(k.child);
}

/** Peak resident set of a process (VmHWM), in bytes. */
export function peakRss(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m![1]) * 1024;
}

export async function refusedCount(port: number, reason: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const m = new RegExp(`^kvd_tcp_refused_total\\{reason="${reason}"\\} (\\d+)`, "m").exec(text);
  return m ? Number(m[1]) : 0;
}

/**
 * One unauthenticated connection that sends a HELLO declaring `dataBytes` of data and then
 * streams them; resolves with the frames answered and whether the daemon closed it.
 */
export function bigHello(port: number, dataBytes: number): Promise<{ frames: Frame[]; closed: boolean }> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    const dec = new FrameDecoder(64 * MiB, true);
    const frames: Frame[] = [];
    const t = setTimeout(() => {
      s.destroy();
      resolve({ frames, closed: false });
    }, 20000);
    // The header declares `dataBytes`; the data then follows in 1 MiB writes while the socket lasts.
    const head = encodeFrame(Op.HELLO, 0, 1, { token: "wrong" }, Buffer.alloc(0))[0]!;
    head.writeUInt32LE(dataBytes, 16);
    s.on("connect", () => {
      s.write(head);
      const chunk = Buffer.alloc(MiB, 7);
      let sent = 0;
      const pump = () => {
        while (sent < dataBytes && !s.destroyed) {
          sent += chunk.length;
          if (!s.write(chunk)) return void s.once("drain", pump);
        }
      };
      pump();
    });
    s.on("data", (d: Buffer) => frames.push(...dec.push(d)));
    s.on("error", () => {});
    s.on("close", () => {
      clearTimeout(t);
      resolve({ frames, closed: true });
    });
  });
}

/** Opens `n` TCP connections that send nothing; resolves once each connected or failed. */
export async function idleConnections(port: number, n: number): Promise<net.Socket[]> {
  const socks: net.Socket[] = [];
  await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<void>((resolve) => {
          const s = net.connect(port, "127.0.0.1");
          socks.push(s);
          s.on("error", () => resolve());
          s.on("connect", () => resolve());
          s.on("close", () => resolve());
        }),
    ),
  );
  return socks;
}

/**
 * Waits until at most `max` of `socks` are still open on this (the client's) side, or `ms`
 * pass; returns how many are. A burst of 2,000 connects overflows the daemon's SYN queue
 * (backlog 511): the kernel answers with SYN cookies, and when the accept queue is full as the
 * client's final ACK arrives, that ACK is dropped. The client then holds an established socket
 * that the server side has no state for, and that the daemon was never handed (measured under
 * load: TcpExtSyncookiesSent 173 = client-open 301 − the daemon's 128; the daemon's own
 * established sockets 128, listen queue 0). Such a socket stays "open" until it sends
 * something, so each still-open socket writes one byte (not a frame: it authenticates
 * nothing): a cookie connection then completes and reaches the daemon, whose guard closes it
 * (cap or auth timeout), or the kernel resets it. The byte is resent while the socket lasts.
 */
export async function settleOpen(socks: net.Socket[], max: number, ms = 60_000): Promise<number> {
  const openNow = () => socks.filter((s) => !s.destroyed && s.readyState === "open");
  for (const s of openNow()) s.write(Buffer.alloc(1));
  const deadline = Date.now() + ms;
  while (openNow().length > max && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  return openNow().length;
}
