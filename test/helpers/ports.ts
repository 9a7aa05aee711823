import { closeSync, mkdirSync, openSync, statSync, utimesSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * Ports are picked at random below Linux's ephemeral range (32768–60999 by default) and
 * checked free. A port from `bind(0)` is an ephemeral one: between our check and the child's
 * bind, the kernel could hand it to any outgoing connection (tests make thousands) or another
 * `bind(0)`, the race behind rare EADDRINUSE start-ups. Ports here are never auto-assigned;
 * random picks (not a sequence) keep concurrent test processes from walking the same ports.
 *
 * Random picks still met: two test processes (the runner runs files in parallel) could pick
 * the same port within the moment between one's check and its child's bind (stop 35's CI: an
 * engine's EADDRINUSE). So every port handed out is also claimed across processes, by
 * creating a file named after it (O_EXCL) in a directory all test processes share; a claim is
 * free again after CLAIM_MS, when the test that took it has long finished.
 */
const FIRST = 15000;
const LAST = 32000;
const CLAIM_MS = 10 * 60_000;
const CLAIMS = join(tmpdir(), `infera-test-ports-${process.getuid?.() ?? "u"}`);
const given = new Set<number>();
mkdirSync(CLAIMS, { recursive: true });

/** Whether a listener could bind `port` on `host` right now (it is closed again at once). */
export function bindable(port: number, host = "127.0.0.1"): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once("error", () => resolve(false));
    srv.listen(port, host, () => srv.close(() => resolve(true)));
  });
}

/**
 * Claims `port` for this process: true when no other test process claimed it in the last
 * CLAIM_MS (nor this one ever). A stale claim is taken over by touching its file.
 */
export function claimPort(port: number): boolean {
  if (given.has(port)) return false;
  const file = join(CLAIMS, String(port));
  try {
    closeSync(openSync(file, "wx"));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    try {
      if (Date.now() - statSync(file).mtimeMs < CLAIM_MS) return false;
      const now = new Date();
      utimesSync(file, now, now);
    } catch {
      return false;
    }
  }
  given.add(port);
  return true;
}

/**
 * Runs `start` (which picks its ports with freePort) again, up to 3 times in all, when it failed
 * because a port was taken between the pick and the bind.
 */
export async function retryOnPortRace<T>(start: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start();
    } catch (err) {
      if (!isPortRace(err) || attempt === 3) throw err;
    }
  }
}

/** True for a start-up (its error, or its output) that failed because a picked port was taken meanwhile. */
export function isPortRace(err: unknown): boolean {
  const text = typeof err === "string" ? err : ((err as Error)?.message ?? "");
  return /EADDRINUSE|address already in use/i.test(text);
}

/** A TCP port that was free on 127.0.0.1 a moment ago, outside the kernel's ephemeral range. */
export async function freePort(): Promise<number> {
  for (let tries = 0; tries < 1000; tries++) {
    const port = FIRST + Math.floor(Math.random() * (LAST - FIRST));
    if (given.has(port)) continue;
    if ((await bindable(port)) && claimPort(port)) return port;
  }
  throw new Error("no free port below the ephemeral range");
}

/**
 * `n` consecutive ports (per-rank sockets bind base + r), each free a moment ago and claimed;
 * returns the first. `bindHost` is where they are checked (0.0.0.0 for sockets bound on all).
 */
export async function freePortRun(n: number, bindHost = "127.0.0.1"): Promise<number> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const base = await freePort();
    if (base + n > LAST) continue;
    let ok = true;
    for (let p = base; p < base + n && ok; p++)
      ok = (await bindable(p, bindHost)) && (p === base || claimPort(p));
    if (ok) return base;
  }
  throw new Error(`no ${n} consecutive free ports found`);
}
