/**
 * The raw HTTP/1.1 client over TLS: a worker URL `https://…` served by a real `node:https`
 * engine stand-in whose certificate a throwaway CA signed (openssl, `makeTlsFiles`).
 *
 * - Not trusted (this process knows no such CA): the handshake fails before the request is
 *   handed to the socket, so the send is refused as `WorkerUnreachableError` (kind `connect`,
 *   "not sent": safe to retry on another worker) and the engine sees no request.
 * - Trusted: there is no per-worker CA setting for the request plane (`infera server` has CA
 *   flags for etcd and NATS only; `HttpExecutor` and static discovery's `/v1/models` use Node's
 *   default trust store), so a private CA reaches the client the way Node takes one: the
 *   NODE_EXTRA_CA_CERTS environment variable, read at process start. Hence a child
 *   `infera server --worker https://…` started with it, asked through the `openai` client,
 *   streamed and not.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import type { WorkerState } from "../../../src/router/types.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { failureKind, WorkerUnreachableError } from "../../../src/transport/types.ts";
import { makeTlsFiles, type TlsFiles } from "../../helpers/etcd.ts";
import { serverArgs, spawnInfera, waitReadyWorkers } from "../../helpers/infera.ts";
import { freePort } from "../../helpers/ports.ts";
import { abandon } from "../../helpers/procs.ts";
import { mixedRecord } from "../../helpers/records.ts";

const MODEL = "tls-model";

/** An engine stand-in over TLS: /v1/models, /metrics, chat completions (JSON or SSE). */
function tlsEngine(files: TlsFiles): { server: Server; posts: () => number; sockets: Set<Socket> } {
  let posts = 0;
  const sockets = new Set<Socket>();
  const server = createServer(
    { key: readFileSync(files.serverKey), cert: readFileSync(files.serverCert) },
    (req, res) => {
      if (req.method === "GET") {
        if (req.url === "/v1/models") {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify({ object: "list", data: [{ id: MODEL, object: "model", root: MODEL }] }));
        } else {
          res.writeHead(200, { "content-type": "text/plain" });
          res.end("");
        }
        return;
      }
      posts++;
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = JSON.parse(Buffer.concat(chunks).toString()) as { stream?: boolean };
        const base = { id: "c1", created: 1, model: MODEL };
        if (!body.stream) {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(
            JSON.stringify({
              ...base,
              object: "chat.completion",
              choices: [
                { index: 0, message: { role: "assistant", content: "secure" }, finish_reason: "stop" },
              ],
              usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
            }),
          );
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        const chunk = (delta: object, finish: string | null) =>
          `data: ${JSON.stringify({ ...base, object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
        res.write(chunk({ role: "assistant", content: "sec" }, null));
        // Apart in time: the answer crosses the proxy as more than one TLS record.
        setTimeout(() => res.end(`${chunk({ content: "ure" }, "stop")}data: [DONE]\n\n`), 5);
      });
    },
  );
  server.on("secureConnection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  return { server, posts: () => posts, sockets };
}

describe("Http1Pool over TLS", () => {
  let dir: string;
  let files: TlsFiles;
  let engine: ReturnType<typeof tlsEngine>;
  let url: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "infera-http1-tls-"));
    files = makeTlsFiles(dir);
    engine = tlsEngine(files);
    await new Promise<void>((r) => engine.server.listen(0, "127.0.0.1", r));
    url = `https://127.0.0.1:${(engine.server.address() as AddressInfo).port}`;
  });
  after(async () => {
    for (const s of engine?.sockets ?? []) s.destroy();
    await new Promise((r) => engine?.server.close(r));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("an untrusted certificate: refused as unreachable, not sent, no request at the engine", async () => {
    const exec = new HttpExecutor();
    const worker = { record: mixedRecord({ id: "w", model: MODEL, url }) } as unknown as WorkerState;
    try {
      for (let i = 0; i < 2; i++) {
        const err = await exec
          .send(worker, "chat", { model: MODEL, messages: [] }, { signal: new AbortController().signal })
          .then(
            () => assert.fail("an untrusted certificate was accepted"),
            (e: unknown) => e,
          );
        assert.ok(err instanceof WorkerUnreachableError, `got ${String(err)}`);
        assert.equal(err.kind, "connect");
        assert.equal(failureKind(err), "connect");
        // Node's verification code for a leaf signed by an unknown issuer.
        assert.match(err.detail, /^not sent: UNABLE_TO_VERIFY_LEAF_SIGNATURE$/);
      }
      assert.equal(engine.posts(), 0, "no request reached the engine");
    } finally {
      await exec.close();
    }
  });

  it("trusted through NODE_EXTRA_CA_CERTS: `infera server` proxies over TLS, streamed and not", async () => {
    const port = await freePort();
    const before = engine.posts();
    const { proc, output } = spawnInfera(serverArgs(port, "--worker", url), {
      logLevel: "warn",
      env: { NODE_EXTRA_CA_CERTS: files.caFile },
    });
    try {
      const base = `http://127.0.0.1:${port}`;
      await waitReadyWorkers(base, proc, output, 1);
      const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "none", maxRetries: 0 });
      const messages = [{ role: "user" as const, content: "hi" }];
      const whole = await client.chat.completions.create({ model: MODEL, messages });
      assert.equal(whole.choices[0]?.message.content, "secure");
      const stream = await client.chat.completions.create({ model: MODEL, messages, stream: true });
      let text = "";
      let chunks = 0;
      for await (const c of stream) {
        chunks++;
        text += c.choices[0]?.delta.content ?? "";
      }
      assert.equal(text, "secure");
      assert.equal(chunks, 2);
      assert.equal(engine.posts() - before, 2, "both answers came from the TLS engine");
    } finally {
      await abandon(proc);
    }
  });
});
