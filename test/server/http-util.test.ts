/**
 * Issue #30 item 11: a body over the limit got 413 with `connection: close`, and the socket
 * closed while the client was still uploading: Node's fetch and the OpenAI SDK saw EPIPE
 * (6/6), and the SDK retried twice, re-sending 5 MiB each time. Now the rest of the upload is
 * read and dropped (bounded), so the client reads the 413 and the SDK does not retry.
 */
import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer, type Server } from "node:http";
import { type AddressInfo, connect } from "node:net";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { readBody } from "../../src/server/http-util.ts";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { waitFor200, waitUntil } from "../helpers/wait.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

const MiB = 1024 * 1024;

describe("a body over the limit (issue #30 item 11)", () => {
  // A server process of its own, as the probe ran it (in one process with the client the
  // race did not show). The limit is checked before any worker is asked: none is needed.
  let server: ReturnType<typeof spawnInfera>;
  let url: string;
  before(async () => {
    const port = await freePort();
    const dead = await freePort();
    server = spawnInfera(serverArgs(port, "--worker", `http://127.0.0.1:${dead}`), {
      logLevel: "warn",
      keepChars: 4000,
    });
    url = `http://127.0.0.1:${port}`;
    await waitFor200(`${url}/health`, { timeoutMs: 30_000, what: "server", output: server.output });
  });
  after(() => {
    server?.proc.kill("SIGKILL");
  });

  const big = () =>
    JSON.stringify({
      model: "m",
      messages: [{ role: "user", content: "x".repeat(5 * MiB) }],
    });

  it("fetch reads the 413 (6/6), and the connection stays usable", async () => {
    for (let i = 0; i < 6; i++) {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: big(),
      });
      assert.equal(res.status, 413);
      const body = (await res.json()) as { error: { code: string; type: string } };
      assert.equal(body.error.code, "request_too_large");
    }
    const ok = await fetch(`${url}/v1/models`);
    assert.equal(ok.status, 200);
    await ok.arrayBuffer();
  });

  it("the openai client gets a 413 APIError and does not retry", async () => {
    let calls = 0;
    const client = new OpenAI({
      baseURL: `${url}/v1`,
      apiKey: "none",
      maxRetries: 2,
      fetch: (input, init) => {
        calls++;
        return fetch(input, init);
      },
    });
    await assert.rejects(
      client.chat.completions.create({
        model: "m",
        messages: [{ role: "user", content: "x".repeat(5 * MiB) }],
      }),
      (e: unknown) => {
        assert.ok(e instanceof OpenAI.APIError, String(e));
        assert.equal(e.status, 413);
        return true;
      },
    );
    assert.equal(calls, 1, "no retry");
  });
});

/**
 * readBody's listeners became locals of the call instead of fields of a reader object (a
 * closure over an object kept in that object kept every request alive through scavenges under
 * Node 24's Maglev; src/server/README.md). What it must still do, on a real node:http server:
 * join a body however it is chunked, refuse one past the limit as its bytes arrive (not only by
 * its declared length) and stop listening, and reject when the client leaves mid-upload.
 */
describe("readBody", () => {
  let server: Server;
  let port: number;
  const outcomes: { result: string; listeners: number }[] = [];
  before(async () => {
    server = createServer((req, res) => {
      readBody(req, 64).then(
        (b) => {
          outcomes.push({ result: `body ${b.toString()}`, listeners: req.listenerCount("data") });
          res.end("ok");
        },
        (e: Error) => {
          outcomes.push({ result: e.constructor.name, listeners: req.listenerCount("data") });
          res.destroy();
        },
      );
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    port = (server.address() as AddressInfo).port;
  });
  after(() => server.close());

  /** Sends `parts` (the head first) a tick apart, optionally leaving after them; resolves once the server decided. */
  async function send(parts: string[], leave: boolean): Promise<{ result: string; listeners: number }> {
    const n = outcomes.length;
    const sock = connect(port, "127.0.0.1");
    sock.on("error", () => {});
    await once(sock, "connect");
    for (const p of parts) {
      sock.write(p);
      await new Promise((r) => setTimeout(r, 5));
    }
    if (leave) sock.destroy();
    await waitUntil(() => outcomes.length > n, 5000, "the server's readBody");
    sock.destroy();
    return outcomes[n]!;
  }

  const head = (length: number | "chunked") =>
    `POST / HTTP/1.1\r\nhost: x\r\n${length === "chunked" ? "transfer-encoding: chunked" : `content-length: ${length}`}\r\n\r\n`;

  it("joins a body sent in pieces", async () => {
    const r = await send([head(11), "hello", " ", "world"], false);
    assert.equal(r.result, "body hello world");
  });

  it("refuses a body past the limit as it arrives, and stops listening", async () => {
    const chunk = (s: string) => `${s.length.toString(16)}\r\n${s}\r\n`;
    const r = await send([head("chunked"), chunk("x".repeat(40)), chunk("y".repeat(40))], false);
    assert.deepEqual(r, { result: "PayloadTooLargeError", listeners: 0 });
  });

  it("rejects with BodyAbortedError when the client leaves mid-upload", async () => {
    const r = await send([head(50), "only part of it"], true);
    assert.deepEqual(r, { result: "BodyAbortedError", listeners: 0 });
  });
});
