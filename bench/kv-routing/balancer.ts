/**
 * A minimal round-robin HTTP load balancer in front of several `infera server` replicas, as a
 * production deployment would have: each request (and so each turn of a conversation) may land
 * on a different replica. Streams both ways; no buffering. It ends the upstream request when
 * the client goes away (bench/fleet-routing: a step that gives up on its backlog must not leave
 * it queued in the engines for the next step). Shared by bench/kv-routing and bench/fleet-routing.
 */
import { createServer, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export async function startBalancer(
  targets: readonly string[],
): Promise<{ url: string; close(): Promise<void> }> {
  let next = 0;
  const srv: Server = createServer((req, res) => {
    const target = new URL(targets[next++ % targets.length]);
    const up = request(
      { host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers },
      (ur) => {
        res.writeHead(ur.statusCode ?? 502, ur.headers);
        ur.pipe(res);
      },
    );
    up.on("error", () => {
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    // The client hung up before the answer was complete: hang up upstream too.
    res.on("close", () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  });
  srv.keepAliveTimeout = 10_000;
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const { port } = srv.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((r) => {
        srv.closeAllConnections();
        srv.close(() => r());
      }),
  };
}
