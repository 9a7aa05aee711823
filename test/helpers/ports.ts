import { createServer } from "node:net";

/**
 * Ports are handed out below Linux's ephemeral range (32768–60999 by default), from a block
 * of this test process's own: a port from `bind(0)` could be handed by the kernel to someone
 * else's `bind(0)` or outgoing connection between our check and the child's bind (the race
 * behind rare EADDRINUSE start-up failures); ports here are never auto-assigned, and
 * concurrent test processes start in different blocks. Each candidate is still checked free.
 */
const FIRST = 15000;
const BLOCK = 200;
const BLOCKS = Math.floor((32000 - FIRST) / BLOCK);
const blockStart = FIRST + ((process.pid * 7919) % BLOCKS) * BLOCK;
let next = 0;

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once("error", () => resolve(false));
    srv.listen(port, "127.0.0.1", () => srv.close(() => resolve(true)));
  });
}

/** A TCP port that was free on 127.0.0.1 a moment ago, outside the kernel's ephemeral range. */
export async function freePort(): Promise<number> {
  for (let tries = 0; tries < BLOCK * BLOCKS; tries++) {
    const i = next++;
    // This process's block first, then the following ones.
    const port = FIRST + ((blockStart - FIRST + i) % (BLOCK * BLOCKS));
    if (await bindable(port)) return port;
  }
  throw new Error("no free port below the ephemeral range");
}
