/**
 * A tiny JSON-over-HTTP listener for connector control routes (Mooncake's bootstrap
 * `GET /query` / `POST /register`, SGLang's `/route`, `/register_dp_rank`, ...). Routes are keyed
 * `"METHOD /path"` (`"* /path"` catches any other method); a handler gets the parsed JSON body
 * (undefined when it is not JSON) and the query string, and returns a payload (200 JSON) or
 * `reply(status, body, "json" | "text")`. Unknown routes get FastAPI's 404
 * `{"detail": "Not Found"}` (Mooncake's bootstrap server is a FastAPI app).
 */
import { once } from "node:events";
import http from "node:http";

export interface Reply {
  status: number;
  body: unknown;
  kind: "json" | "text";
}
export type JsonReply = unknown;
export type JsonRoutes = Record<
  string,
  (body: unknown, query: URLSearchParams) => JsonReply | Promise<JsonReply>
>;

const REPLY = Symbol("reply");

/** An answer with its own status and content type (aiohttp's `web.Response(text=...)` is text). */
export function reply(status: number, body: unknown, kind: "json" | "text" = "json"): Reply {
  const out: Reply & { [REPLY]: true } = { status, body, kind, [REPLY]: true };
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
      const url = new URL(req.url ?? "/", "http://bootstrap");
      const path = url.pathname;
      const route = routes[`${req.method} ${path}`] ?? routes[`* ${path}`];
      const send = (status: number, payload: unknown, kind: "json" | "text" = "json") => {
        const body = kind === "text" ? String(payload) : JSON.stringify(payload);
        res.writeHead(status, {
          "content-type": kind === "text" ? "text/plain; charset=utf-8" : "application/json",
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
        const out = await route(body, url.searchParams);
        if (out && typeof out === "object" && REPLY in out) {
          const r = out as unknown as Reply;
          send(r.status, r.body, r.kind);
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
