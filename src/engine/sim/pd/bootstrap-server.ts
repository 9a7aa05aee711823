/**
 * A tiny JSON-over-HTTP listener for connector control routes (Mooncake's bootstrap
 * `GET /query`). Unknown routes get an OpenAI-shaped 404.
 */
import { once } from "node:events";
import http from "node:http";

export type JsonRoutes = Record<string, () => unknown>;

export class JsonHttpServer {
  private readonly server: http.Server;
  private boundPort = 0;

  constructor(routes: JsonRoutes) {
    this.server = http.createServer((req, res) => {
      const path = new URL(req.url ?? "/", "http://bootstrap").pathname;
      const route = req.method === "GET" ? routes[path] : undefined;
      const [status, payload] = route
        ? [200, route()]
        : [
            404,
            {
              error: {
                message: `no route ${req.method} ${path}`,
                type: "not_found_error",
                param: null,
                code: "not_found",
              },
            },
          ];
      const body = JSON.stringify(payload);
      res.writeHead(status, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(body),
      });
      res.end(body);
    });
  }

  get port(): number {
    return this.boundPort;
  }

  async listen(port: number, bindHost: string): Promise<number> {
    this.server.listen(port, bindHost);
    await once(this.server, "listening");
    const addr = this.server.address();
    this.boundPort = typeof addr === "object" && addr ? addr.port : port;
    return this.boundPort;
  }

  async close(): Promise<void> {
    if (!this.server.listening) return;
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
