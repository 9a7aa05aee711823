// The floor the sim is compared with: the least a Node HTTP server can do to serve the same
// streams. One interval timer ticks every ITL_MS and writes one ~200-byte SSE event to every
// open stream; a stream ends after its max_tokens events. No engine, no tokenizer, no JSON
// work beyond parsing the request body.
import { createServer } from "node:http";

const port = Number(process.argv[2]);
const itlMs = Number(process.argv[3] ?? 5);
const open = new Set();
const event = `data: ${JSON.stringify({ id: "chatcmpl-x", object: "chat.completion.chunk", created: 0, model: "sim-model", choices: [{ index: 0, delta: { content: " word" }, logprobs: null, finish_reason: null }] })}\n\n`;

createServer((req, res) => {
  if (req.method === "GET") {
    res.end("ok");
    return;
  }
  let body = "";
  req.on("data", (c) => {
    body += c;
  });
  req.on("end", () => {
    const max = JSON.parse(body).max_tokens ?? 256;
    res.writeHead(200, { "content-type": "text/event-stream" });
    const s = { res, left: max };
    open.add(s);
    res.on("close", () => open.delete(s));
  });
}).listen(port, "127.0.0.1");

setInterval(() => {
  for (const s of open) {
    if (--s.left <= 0) {
      open.delete(s);
      s.res.end(`${event}data: [DONE]\n\n`);
    } else s.res.write(event);
  }
}, itlMs);
