import { createServer } from "node:net";

/**
 * Ports are picked at random below Linux's ephemeral range (32768–60999 by default) and
 * checked free. A port from `bind(0)` is an ephemeral one: between our check and the child's
 * bind, the kernel could hand it to any outgoing connection (tests make thousands) or another
 * `bind(0)`, the race behind rare EADDRINUSE start-ups. Ports here are never auto-assigned;
 * random picks (not a sequence) keep concurrent test processes from walking the same ports.
 */
const FIRST = 15000;
const LAST = 32000;
const given = new Set<number>();

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once("error", () => resolve(false));
    srv.listen(port, "127.0.0.1", () => srv.close(() => resolve(true)));
  });
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

/** True for a start-up that failed because a picked port was taken meanwhile. */
export function isPortRace(err: unknown): boolean {
  return /EADDRINUSE|address already in use/.test((err as Error)?.message ?? "");
}

/** A TCP port that was free on 127.0.0.1 a moment ago, outside the kernel's ephemeral range. */
export async function freePort(): Promise<number> {
  for (let tries = 0; tries < 1000; tries++) {
    const port = FIRST + Math.floor(Math.random() * (LAST - FIRST));
    // Never the same port twice in one process: an earlier one may not be bound yet.
    if (given.has(port)) continue;
    if (await bindable(port)) {
      given.add(port);
      return port;
    }
  }
  throw new Error("no free port below the ephemeral range");
}
