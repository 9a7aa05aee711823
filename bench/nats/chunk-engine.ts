/**
 * A stand-in engine for the per-chunk phase of the benchmark: answers every POST with an SSE
 * stream of `events` events of ~100 bytes, written one by one as fast as the socket takes them,
 * so the transports' per-chunk path (not the sim) is what is measured.
 * `node bench/nats/chunk-engine.ts <events>` prints its URL.
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

const events = Number(process.argv[2] ?? 20000);
const line = Buffer.from(`data: {"choices":[{"index":0,"delta":{"content":"${"x".repeat(48)}"}}]}\n\n`);
const server = createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    let i = 0;
    const pump = () => {
      while (i < events) {
        i++;
        if (!res.write(line)) {
          res.once("drain", pump);
          return;
        }
      }
      res.end("data: [DONE]\n\n");
    };
    pump();
  });
});
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(`http://127.0.0.1:${(server.address() as AddressInfo).port}\n`);
});
process.on("SIGTERM", () => process.exit(0));
