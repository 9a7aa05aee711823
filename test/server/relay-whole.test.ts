import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, it } from "node:test";
import { relayWhole } from "../../src/server/relay-whole.ts";
import type { UpstreamResponse } from "../../src/transport/types.ts";
import { RequestAbort } from "../../src/util/abort.ts";
import { createLogger } from "../../src/util/log.ts";

/** An answer whose body yields the given chunks as plain Uint8Arrays (what the NATS client gives). */
function answer(status: number, chunks: Uint8Array[]): UpstreamResponse {
  return {
    status,
    headers: { "content-type": "application/json" },
    contentType: "application/json",
    body: (async function* () {
      for (const c of chunks) yield c;
    })(),
    json: async () => null,
    abort() {},
  };
}

/** Runs relayWhole behind a real HTTP server and returns what a client receives. */
async function relayed(up: UpstreamResponse): Promise<{ status: number; text: string }> {
  const ctx = { maxResponseBufferBytes: 1 << 20, logger: createLogger("test") };
  const server = createServer((_req, res) => {
    relayWhole(ctx, res, up, "req-1", new RequestAbort()).catch((err: { status?: number }) => {
      res.writeHead(err.status ?? 500).end(String(err));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const port = (server.address() as AddressInfo).port;
    return await new Promise((resolve, reject) => {
      request({ port, host: "127.0.0.1", path: "/" }, (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (d: string) => {
          text += d;
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
      })
        .on("error", reject)
        .end();
    });
  } finally {
    server.close();
  }
}

describe("relayWhole", () => {
  const json = '{"id":"cmpl-1","object":"text_completion","choices":[],"usage":{"prompt_tokens":3}}';

  it("a valid answer in one plain Uint8Array chunk is relayed as it is, not as its byte values", async () => {
    // A Uint8Array that is not a Buffer: its own toString() ignores "utf8" and gives "123,34,…".
    const bytes = new Uint8Array(new TextEncoder().encode(json));
    assert.equal(Buffer.isBuffer(bytes), false);
    const got = await relayed(answer(200, [bytes]));
    assert.equal(got.status, 200);
    assert.deepEqual(JSON.parse(got.text), JSON.parse(json));
  });

  it("the same answer split into plain Uint8Array chunks", async () => {
    const all = new TextEncoder().encode(json);
    const got = await relayed(answer(200, [all.subarray(0, 10), all.subarray(10)]));
    assert.equal(got.status, 200);
    assert.deepEqual(JSON.parse(got.text), JSON.parse(json));
  });

  it("an answer that is not a JSON object is still a 502", async () => {
    const got = await relayed(answer(200, [new TextEncoder().encode("[1,2]")]));
    assert.equal(got.status, 502);
  });
});
