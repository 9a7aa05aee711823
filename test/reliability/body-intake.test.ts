/**
 * A client that declares a large body and sends little must not pin memory (issue #17). Each
 * connection declares the server's body limit in Content-Length and sends one byte, then
 * waits. The server used to allocate a buffer of the declared size when the first byte
 * arrived, so 200 such connections held 800 MiB of ArrayBuffers (the V8 external memory that
 * also drives its full GCs); the body buffer now grows with the bytes received.
 *
 * The server runs in this process so its ArrayBuffer memory (`process.memoryUsage()`) is
 * what is measured; nothing else here allocates any while the connections wait.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { connect, type Socket } from "node:net";
import { after, test } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
const CONNECTIONS = 200;
const LIMIT = 4 * 1024 * 1024;
const MIB = 1024 * 1024;
/** ArrayBuffer growth allowed for all the connections together (one declared body is 4 MiB). */
const BOUND = 16 * MIB;

let engine: Server | null = null;
let server: InferaServer | null = null;
const sockets: Socket[] = [];
after(async () => {
  for (const s of sockets) s.destroy();
  await server?.close();
  await new Promise((r) => (engine ? engine.close(r) : r(undefined)));
  fileDone(import.meta.url);
});

test(`${CONNECTIONS} connections declaring ${LIMIT / MIB} MiB and sending 1 byte hold no buffers of that size`, async () => {
  engine = createServer((_req, res) => res.end("{}"));
  await new Promise<void>((r) => engine!.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
  server = await startServer(
    { port: 0, host: "127.0.0.1", scrapeIntervalMs: 0, policy: "round-robin", maxBodyBytes: LIMIT },
    {
      discovery: new MemoryDiscovery([
        completeRecord({ id: "w", url, model: "m", servedModelNames: ["m"], engine: "vllm", role: "mixed" }),
      ]),
    },
  );
  const { port } = new URL(server.url);
  globalThis.gc?.();
  const base = process.memoryUsage().arrayBuffers;
  const head =
    `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
    `content-length: ${LIMIT}\r\n\r\n{`;
  await Promise.all(
    Array.from(
      { length: CONNECTIONS },
      () =>
        new Promise<void>((resolve, reject) => {
          const s = connect(Number(port), "127.0.0.1", () => s.write(head, () => resolve()));
          s.on("error", reject);
          sockets.push(s);
        }),
    ),
  );
  // The server reads each connection's byte on its own turn: watch for two seconds.
  let peak = 0;
  for (let i = 0; i < 20; i++) {
    await new Promise((r) => setTimeout(r, 100));
    peak = Math.max(peak, process.memoryUsage().arrayBuffers - base);
  }
  const open = sockets.filter((s) => !s.destroyed).length;
  const figure = `${CONNECTIONS} connections (${open} still open) each declaring ${LIMIT / MIB} MiB and sending 1 byte: server ArrayBuffers +${(peak / MIB).toFixed(1)} MiB`;
  const pass = peak < BOUND && open === CONNECTIONS;
  record(
    import.meta.url,
    "declared-but-unsent bodies",
    figure,
    `< ${BOUND / MIB} MiB for all (old: a buffer of the declared size each, +${(CONNECTIONS * LIMIT) / MIB} MiB)`,
    pass,
  );
  assert.equal(open, CONNECTIONS, "the connections are kept waiting, not refused");
  assert.ok(peak < BOUND, figure);
});
