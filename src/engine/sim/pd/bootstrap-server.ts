/**
 * A tiny JSON-over-HTTP listener for connector control routes (Mooncake's bootstrap
 * `GET /query` / `POST /register`). Routes are keyed `"METHOD /path"`; a handler gets the
 * parsed JSON body and returns `[status, payload]` or just a payload (200). Unknown routes get
 * FastAPI's 404 `{"detail": "Not Found"}` (the real bootstrap servers are FastAPI apps).
 */
import { once } from "node:events";
import http from "node:http";

export type JsonReply = unknown | { status: number; body: unknown };
export type JsonRoutes = Record<string, (body: unknown) => JsonReply | Promise<JsonReply>>;

const REPLY = Symbol("reply");

/** A non-200 answer from a route handler. */
export function reply(status: number, body: unknown): { status: number; body: unknown } {
  const out: { status: number; body: unknown; [REPLY]: true } = { status, body, [REPLY]: true };
  return out;
}

function readJson(req: http.IncomingMessage): Promise<unknown> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      try {
        resolve(text ? JSON.parse(text) : null);
      } catch {
        resolve(undefined);
      }
    });
    req.on("error", () => resolve(undefined));
  });
}

export class JsonHttpServer {
  private readonly server: http.Server;
  private boundPort = 0;

  constructor(routes: JsonRoutes) {
    this.server = http.createServer((req, res) => {
      const path = new URL(req.url ?? "/", "http://bootstrap").pathname;
      const route = routes[`${req.method} ${path}`];
      const send = (status: number, payload: unknown) => {
        const body = JSON.stringify(payload);
        res.writeHead(status, {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(body),
        });
        res.end(body);
      };
      if (!route) {
        send(404, { detail: "Not Found" });
        return;
      }
      void (async () => {
        const body = req.method === "GET" ? null : await readJson(req);
        const out = await route(body);
        if (out && typeof out === "object" && REPLY in out) {
          const r = out as unknown as { status: number; body: unknown };
          send(r.status, r.body);
        } else send(200, out);
      })().catch((err: unknown) => send(500, { detail: String(err) }));
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
