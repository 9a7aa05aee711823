/**
 * A worker that answers wrongly, per model name (issue #17's broken worker answers): invalid
 * JSON, a plain 500, a status over 599, garbage inside or after an event stream, an 8 MiB
 * answer whose second half waits for `release()`; any other model gets a valid answer.
 */
import { createServer, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";

/** A worker that answers wrongly, per model name. */
export function misbehavingWorker(): { server: Server; release: () => void; sockets: Set<Socket> } {
  let releaseHuge: () => void = () => {};
  const hugeGo = new Promise<void>((r) => {
    releaseHuge = r;
  });
  const sockets = new Set<Socket>();
  const server = createServer((req, res) => {
    if (req.method === "GET") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ object: "list", data: [] }));
      return;
    }
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString()) as { model: string };
      answer(body.model, res, hugeGo);
    });
  });
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  return { server, release: () => releaseHuge(), sockets };
}

const CHUNK = JSON.stringify({
  id: "c",
  object: "chat.completion.chunk",
  choices: [{ index: 0, delta: { content: "x" } }],
});
export const HUGE_BYTES = 8 * 1024 * 1024;

function answer(model: string, res: ServerResponse, hugeGo: Promise<void>): void {
  switch (model) {
    case "bad-json":
      res.writeHead(200, { "content-type": "application/json" });
      res.end('{"id": "x", "choices": [');
      return;
    case "plain-500":
      res.writeHead(500, { "content-type": "text/plain" });
      res.end("Internal Server Error");
      return;
    case "bad-status":
      res.writeHead(700, { "content-type": "application/json" });
      res.end("{}");
      return;
    case "garbage-sse":
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(`data: ${CHUNK}\n\n`);
      setTimeout(() => res.end("<html>502 Bad Gateway</html>\n\n"), 20);
      return;
    case "garbage-tail":
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(`data: ${CHUNK}\n\nnot an event`);
      return;
    case "huge": {
      // Half the answer, then the rest only once the client has seen its first bytes: a
      // server that buffers the whole answer before relaying never gets there.
      res.writeHead(200, { "content-type": "application/json" });
      const pad = "x".repeat(HUGE_BYTES / 2);
      res.write(
        `{"id":"h","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"${pad}`,
      );
      void hugeGo.then(() =>
        res.end(
          `${pad}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`,
        ),
      );
      return;
    }
    default:
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ id: "ok", object: "chat.completion", choices: [] }));
  }
}
