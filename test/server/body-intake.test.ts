/**
 * Request bodies read into pooled buffers (issue #17): a body arrives whole whatever its size
 * and chunking (and a reused buffer's old bytes never leak into the next body), large bodies
 * reuse buffers instead of allocating, a body whose upstream answer was an error is not reused
 * (the connection may still be sending from it), and the body parser worker runs from its own
 * module, from the sources and as built by scripts/build.mjs, with the loop as the fallback
 * where the file is missing (the single executable).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer, request as httpRequest, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";
import { Worker } from "node:worker_threads";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { MAX_BODY_DEPTH } from "../../src/protocol/body-depth.ts";
import { InvalidJsonError } from "../../src/protocol/errors.ts";
import { bodyBufferStats, bufferSizeFor, POOL_FROM } from "../../src/server/body-buffers.ts";
import { BodyParserPool, OFF_LOOP_BODY_BYTES } from "../../src/server/body-parser-pool.ts";
import type { WorkerConfig, WorkerReply } from "../../src/server/body-parser-worker.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** A chat body of exactly `size` bytes, its padding drawn from `seed` (so stale bytes show). */
function chatBody(size: number, seed: number, marker = "", stream = false): Buffer {
  const shell = (pad: string) =>
    JSON.stringify({
      model: "m",
      messages: [{ role: "user", content: marker + pad }],
      max_tokens: 1,
      ...(stream ? { stream } : {}),
    });
  const n = size - Buffer.byteLength(shell(""));
  assert.ok(n >= 0, `a chat body is at least ${size - n} bytes`);
  let s = seed >>> 0;
  let pad = "";
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    pad += String.fromCharCode(0x61 + ((s >>> 16) % 26));
  }
  const out = Buffer.from(shell(pad));
  assert.equal(out.length, size);
  return out;
}

describe("request bodies through the server", () => {
  let engine: Server;
  let server: InferaServer;
  const received: Buffer[] = [];

  before(async () => {
    engine = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks);
        if (req.method === "POST") received.push(body);
        // An error answer (as an engine's auth or overload check gives, before the prompt).
        const status = body.includes("ANSWER-400") ? 400 : 200;
        if (status === 200 && body.includes('"stream":true')) {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end('data: {"id":"x","object":"chat.completion.chunk","choices":[]}\n\ndata: [DONE]\n\n');
          return;
        }
        res.writeHead(status, { "content-type": "application/json" });
        res.end(
          status === 200
            ? JSON.stringify({
                id: "x",
                object: "chat.completion",
                model: "m",
                choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
              })
            : JSON.stringify({ error: { message: "no", type: "BadRequestError", code: 400 } }),
        );
      });
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
    const memory = new MemoryDiscovery([
      completeRecord({ id: "w", url, model: "m", servedModelNames: ["m"], engine: "vllm", role: "mixed" }),
    ]);
    server = await startServer(
      {
        port: 0,
        host: "127.0.0.1",
        scrapeIntervalMs: 0,
        policy: "round-robin",
        maxBodyBytes: 2 * 1024 * 1024,
      },
      { discovery: memory },
    );
  });
  after(async () => {
    await server?.close();
    await new Promise((r) => engine?.close(r));
  });

  /** Sends `body` in pieces of random sizes, a loop turn apart, so the server sees many chunkings. */
  const send = (body: Buffer, seed: number): Promise<number> =>
    new Promise((resolve, reject) => {
      const u = new URL(`${server.url}/v1/chat/completions`);
      const req = httpRequest(
        {
          host: u.hostname,
          port: u.port,
          path: u.pathname,
          method: "POST",
          headers: { "content-type": "application/json", "content-length": body.length },
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        },
      );
      req.on("error", reject);
      let s = seed;
      (async () => {
        for (let at = 0; at < body.length; ) {
          s = (Math.imul(s, 1103515245) + 12345) >>> 0;
          const n = 1 + ((s >>> 8) % (96 * 1024));
          if (!req.write(body.subarray(at, at + n))) await new Promise((r) => req.once("drain", r));
          at += n;
          if (s % 3 === 0) await new Promise((r) => setImmediate(r));
        }
        req.end();
      })().catch(reject);
    });

  it("every size arrives whole, however it is chunked, and never with a reused buffer's old bytes", async () => {
    const sizes = [
      90,
      1000,
      POOL_FROM - 1,
      POOL_FROM,
      POOL_FROM + 1,
      200_000,
      OFF_LOOP_BODY_BYTES + 7,
      1_100_000,
      // Smaller after larger: these reuse buffers that held longer bodies.
      OFF_LOOP_BODY_BYTES + 1,
      POOL_FROM + 3,
      300_000,
    ];
    for (const [i, size] of sizes.entries()) {
      const body = chatBody(size, i + 1);
      received.length = 0;
      assert.equal(await send(body, i + 7), 200, `size ${size}`);
      assert.equal(received.length, 1);
      assert.ok(received[0]!.equals(body), `size ${size}: the engine got the client's bytes`);
    }
  });

  it("a streamed body gets stream_options spliced in, in its pooled buffer or copied when it has no room", async () => {
    const field = ',"stream_options":{"include_usage":true}';
    const sizes: number[] = [];
    // Bodies that fill their buffer to the last byte, leave one byte short of room, or just enough.
    for (const room of [0, field.length - 1, field.length]) {
      for (const cap of [2 * POOL_FROM, 4 * POOL_FROM, 16 * POOL_FROM]) sizes.push(cap - room);
    }
    sizes.push(1000);
    for (const [i, size] of sizes.entries()) {
      const body = chatBody(size, 40 + i, "", true);
      received.length = 0;
      assert.equal(await send(body, i), 200, `size ${size}`);
      const text = body.toString();
      assert.equal(received[0]?.toString(), `${text.slice(0, -1)}${field}}`, `size ${size}`);
    }
    // And a plain body after a spliced one in the same buffer: the spliced bytes do not linger.
    const plain = chatBody(4 * POOL_FROM - field.length, 60);
    received.length = 0;
    assert.equal(await send(plain, 1), 200);
    assert.ok(received[0]!.equals(plain));
  });

  it("large bodies reuse buffers: a stream of them allocates none after the first", async () => {
    const body = chatBody(OFF_LOOP_BODY_BYTES + 100, 3);
    assert.equal(await send(body, 1), 200);
    const before = bodyBufferStats();
    for (let i = 0; i < 20; i++) assert.equal(await send(body, i), 200);
    const now = bodyBufferStats();
    assert.equal(now.allocated, before.allocated, "no buffer allocated for 20 more bodies");
    assert.equal(now.lent, before.lent, "every buffer given back");
    assert.ok(now.freeBytes >= bufferSizeFor(body.length), "the body's buffer is idle in the pool");
  });

  it("a body answered with an error is left to the GC, not reused (its connection may still be sending it)", async () => {
    const ok = chatBody(OFF_LOOP_BODY_BYTES + 100, 5);
    assert.equal(await send(ok, 1), 200);
    const before = bodyBufferStats();
    assert.equal(await send(chatBody(OFF_LOOP_BODY_BYTES + 100, 6, "ANSWER-400"), 2), 400);
    assert.equal(bodyBufferStats().lent, before.lent + 1, "the error-answered body's buffer is not back");
    assert.equal(await send(ok, 3), 200);
    assert.equal(bodyBufferStats().lent, before.lent + 1, "a 200 gives its buffer back");
  });

  it("a body refused by the server (invalid JSON) gives its buffer back", async () => {
    const bad = chatBody(OFF_LOOP_BODY_BYTES + 100, 8);
    bad[bad.length - 1] = 0x20; // the closing brace gone
    const before = bodyBufferStats();
    assert.equal(await send(bad, 4), 400);
    assert.equal(bodyBufferStats().lent, before.lent);
  });
});

describe("the body parser worker's module", () => {
  const cases: unknown[] = [
    { model: "m", messages: [{ role: "user", content: "é".repeat(40_000) }], n: [1, 2, { x: null }] },
    { model: "m", prompt: "x".repeat(300_000) },
  ];
  const nested = (d: number): string => "[".repeat(d) + "]".repeat(d);

  it("without its file (the single executable): bodies are parsed on the loop, same values and errors", async () => {
    for (const file of [null, new URL("file:///nonexistent/body-parser-worker.js")]) {
      const pool = new BodyParserPool({ workerFile: file });
      try {
        assert.equal(pool.offLoop, false);
        for (const c of cases) {
          const raw = Buffer.from(JSON.stringify(c));
          const got = await pool.parse(raw);
          assert.deepEqual(got.value, c);
          assert.ok(got.raw.equals(raw));
        }
        await assert.rejects(pool.parse(Buffer.from('{"a":')), InvalidJsonError);
        await assert.rejects(pool.parse(Buffer.from(nested(MAX_BODY_DEPTH + 1))), { status: 400 });
      } finally {
        await pool.close();
      }
    }
    const fromSources = new BodyParserPool();
    assert.equal(fromSources.offLoop, true, "the sources' worker module is found");
    await fromSources.close();
  });

  it("as built by scripts/build.mjs: the bundle points at the built worker, which parses on its own", async () => {
    const out = mkdtempSync(join(tmpdir(), "infera-build-"));
    try {
      await run(process.execPath, [join(ROOT, "scripts/build.mjs"), "--outdir", out], { cwd: ROOT });
      const workerJs = join(out, "body-parser-worker.js");
      // The pool's chunk resolves the define against its source file's URL (the build rewrites
      // import.meta.url so): that must land on the built worker.
      const chunk = readdirSync(out)
        .filter((f) => f.endsWith(".js"))
        .map((f) => readFileSync(join(out, f), "utf8"))
        .find((t) => t.includes("// src/server/body-parser-pool.ts"));
      assert.ok(chunk, "the pool is in a chunk");
      const rel = /"([^"]*body-parser-worker\.js)"/.exec(chunk)?.[1];
      assert.ok(rel, "the worker's path is defined in the bundle");
      const poolSource = pathToFileURL(join(ROOT, "src/server/body-parser-pool.ts"));
      assert.equal(fileURLToPath(new URL(rel, poolSource)), workerJs);

      const workerData: WorkerConfig = {
        maxDepth: MAX_BODY_DEPTH,
        crashMarker: "",
        longChars: 1000,
        maxSpans: 8,
      };
      const worker = new Worker(workerJs, { workerData, execArgv: [] });
      try {
        const ask = (text: string): Promise<WorkerReply> => {
          const raw = Buffer.from(text);
          const buf = raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length) as ArrayBuffer;
          const reply = new Promise<WorkerReply>((r) => worker.once("message", r));
          worker.postMessage({ id: 1, buf, off: 0, len: raw.length }, [buf]);
          return reply;
        };
        const ok = await ask(JSON.stringify({ a: [1, "x".repeat(2000)] }));
        assert.ok(ok.ok);
        assert.deepEqual(ok.value, { a: [1, ""] }, "the long string left as a span");
        assert.deepEqual(
          ok.spans.map((s) => s[0]),
          [["a", 1]],
        );
        const deep = await ask(nested(MAX_BODY_DEPTH + 1));
        assert.ok(!deep.ok && deep.kind === "depth", "the one depth check, bundled");
        const bad = await ask("{");
        assert.ok(!bad.ok && bad.kind === "json");
      } finally {
        await worker.terminate();
      }
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
