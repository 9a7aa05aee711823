import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A scripted OpenAI-shaped server for the client's failure paths (500s, broken streams, hangs),
 * which a correct engine never produces on demand. `mode` picks the behaviour per request.
 */
export type FakeMode = "ok" | "500" | "malformed" | "no-done" | "drop" | "hang" | "stream-error";

export interface FakeServer {
  url: string;
  /** Bodies received, in order. */
  bodies: Array<Record<string, unknown>>;
  /** Authorization header of each request, in order. */
  auth: Array<string | undefined>;
  close(): Promise<void>;
}

export async function startFake(
  mode: FakeMode | ((n: number) => FakeMode),
  opts: { chunks?: number; gapMs?: number; promptTokens?: number; cachedTokens?: number } = {},
): Promise<FakeServer> {
  const bodies: Array<Record<string, unknown>> = [];
  const auth: Array<string | undefined> = [];
  const chunks = opts.chunks ?? 4;
  const gap = opts.gapMs ?? 5;
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    let raw = "";
    for await (const c of req) raw += c;
    const body = JSON.parse(raw) as Record<string, unknown>;
    const n = bodies.length;
    bodies.push(body);
    auth.push(req.headers.authorization);
    const m = typeof mode === "function" ? mode(n) : mode;
    if (m === "500") {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "boom", type: "server_error", param: null, code: null } }));
      return;
    }
    if (m === "hang") return; // never answers; the client's timeout must fire
    const usage = {
      prompt_tokens: opts.promptTokens ?? 100,
      completion_tokens: chunks,
      total_tokens: (opts.promptTokens ?? 100) + chunks,
      prompt_tokens_details: { cached_tokens: opts.cachedTokens ?? 40 },
    };
    if (!body.stream) {
      if (m === "malformed") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end("{not json");
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          id: "x",
          object: "chat.completion",
          choices: [
            { index: 0, message: { role: "assistant", content: "a b c d" }, finish_reason: "length" },
          ],
          usage,
        }),
      );
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    const send = (o: unknown) => res.write(`data: ${JSON.stringify(o)}\n\n`);
    send({ choices: [{ index: 0, delta: { role: "assistant", content: "" } }] });
    for (let i = 0; i < chunks; i++) {
      await new Promise((r) => setTimeout(r, gap));
      if (m === "malformed" && i === 1) {
        res.write("data: {broken\n\n");
        continue;
      }
      if (m === "drop" && i === 1) {
        res.socket?.destroy();
        return;
      }
      if (m === "stream-error" && i === 1) {
        send({ error: { message: "engine died", type: "server_error" } });
        continue;
      }
      send({ choices: [{ index: 0, delta: { content: `t${i} ` } }] });
    }
    if (body.stream_options) send({ choices: [], usage });
    if (m !== "no-done") res.write("data: [DONE]\n\n");
    res.end();
  };
  const server: Server = createServer((req, res) => {
    handle(req, res).catch(() => res.destroy());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    bodies,
    auth,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
