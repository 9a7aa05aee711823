/**
 * Issue #30 item 11: a body over the limit got 413 with `connection: close`, and the socket
 * closed while the client was still uploading: Node's fetch and the OpenAI SDK saw EPIPE
 * (6/6), and the SDK retried twice, re-sending 5 MiB each time. Now the rest of the upload is
 * read and dropped (bounded), so the client reads the 413 and the SDK does not retry.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { waitFor200 } from "../helpers/wait.ts";

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
