import assert from "node:assert/strict";
import { connect } from "node:net";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { completeRecord } from "../../src/discovery/static.ts";
import { freePort } from "../helpers/ports.ts";
import { type Cluster, startCluster } from "./cluster.ts";

interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

describe("bad input gets the right status and OpenAI error shape", () => {
  let c: Cluster;
  let url: string;
  before(async () => {
    c = await startCluster(1, { config: { maxBodyBytes: 64 * 1024, apiKeys: ["sk-test-1", "sk-test-2"] } });
    url = c.server.url;
    // A model whose only worker is down: known to discovery, but nothing can serve it.
    c.memory.put(
      completeRecord({
        id: "dead",
        url: `http://127.0.0.1:${await freePort()}`,
        model: "dead-model",
        servedModelNames: ["dead-model"],
      }),
    );
  });
  after(async () => {
    await c?.close();
  });

  const AUTH = { authorization: "Bearer sk-test-2", "content-type": "application/json" };
  async function post(path: string, body: string | Uint8Array, headers: Record<string, string> = AUTH) {
    const res = await fetch(`${url}${path}`, { method: "POST", headers, body: body as BodyInit });
    const text = await res.text();
    return { status: res.status, headers: res.headers, body: JSON.parse(text) as ErrorBody };
  }
  const chat = (extra: Record<string, unknown>) =>
    JSON.stringify({
      model: "sim-model",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 1,
      ...extra,
    });

  it("malformed JSON → 400 invalid_json", async () => {
    const r = await post("/v1/chat/completions", '{"model": "sim-model", "messages": [');
    assert.equal(r.status, 400);
    assert.equal(r.body.error.code, "invalid_json");
    assert.equal(r.body.error.type, "invalid_request_error");
  });

  it("invalid UTF-8 → 400 invalid_json", async () => {
    const bytes = Buffer.concat([
      Buffer.from('{"model":"'),
      Buffer.from([0xc3, 0x28, 0xff]),
      Buffer.from('"}'),
    ]);
    const r = await post("/v1/chat/completions", bytes);
    assert.equal(r.status, 400);
    assert.equal(r.body.error.code, "invalid_json");
  });

  it("non-object bodies → 400", async () => {
    for (const b of ["[]", "null", "42", '"x"']) {
      const r = await post("/v1/chat/completions", b);
      assert.equal(r.status, 400, b);
      assert.ok(r.body.error.message);
    }
  });

  it("wrong types → 400 naming the field in param", async () => {
    const cases: Array<[string, string, string]> = [
      ["/v1/chat/completions", JSON.stringify({ model: "sim-model" }), "messages"],
      ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }] }), "model"],
      ["/v1/chat/completions", chat({ model: 7 }), "model"],
      ["/v1/chat/completions", chat({ messages: [{ role: "user", content: 5 }] }), "messages[0].content"],
      ["/v1/chat/completions", chat({ messages: [{ content: "x" }] }), "messages[0].role"],
      ["/v1/chat/completions", chat({ stream: "yes" }), "stream"],
      [
        "/v1/chat/completions",
        chat({ stream_options: { include_usage: "y" } }),
        "stream_options.include_usage",
      ],
      ["/v1/completions", JSON.stringify({ model: "sim-model" }), "prompt"],
      ["/v1/completions", JSON.stringify({ model: "sim-model", prompt: { a: 1 } }), "prompt"],
    ];
    for (const [path, body, param] of cases) {
      const r = await post(path, body);
      assert.equal(r.status, 400, body);
      assert.equal(r.body.error.param, param, body);
      assert.equal(r.body.error.type, "invalid_request_error");
    }
  });

  it("unknown model → 404 model_not_found", async () => {
    const r = await post("/v1/chat/completions", chat({ model: "no-such-model" }));
    assert.equal(r.status, 404);
    assert.equal(r.body.error.code, "model_not_found");
    assert.equal(r.body.error.param, "model");
  });

  it("no live worker → 503 with Retry-After", async () => {
    const r = await post("/v1/chat/completions", chat({ model: "dead-model" }));
    assert.equal(r.status, 503);
    assert.equal(r.body.error.code, "no_worker_available");
    assert.ok(Number(r.headers.get("retry-after")) >= 1);
  });

  it("body over the size limit → 413 (declared length and chunked upload)", async () => {
    const big = chat({ padding: "x".repeat(100 * 1024) });
    const r = await post("/v1/chat/completions", big);
    assert.equal(r.status, 413);
    assert.equal(r.body.error.code, "request_too_large");
    // Chunked (no content-length): the limit is enforced while reading.
    const chunked = new ReadableStream<Uint8Array>({
      start(ctrl) {
        for (let i = 0; i < 10; i++) ctrl.enqueue(new TextEncoder().encode("x".repeat(16 * 1024)));
        ctrl.close();
      },
    });
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: AUTH,
      body: chunked,
      duplex: "half",
    } as RequestInit & { duplex: "half" }).catch((e: Error) => e);
    if (!(res instanceof Error)) assert.equal(res.status, 413);
  });

  it("missing or wrong API key → 401; /health and /ready stay open, /metrics needs the key", async () => {
    const noKey = await post("/v1/chat/completions", chat({}), { "content-type": "application/json" });
    assert.equal(noKey.status, 401);
    assert.equal(noKey.body.error.type, "authentication_error");
    const wrong = await post("/v1/chat/completions", chat({}), { authorization: "Bearer sk-test-3" });
    assert.equal(wrong.status, 401);
    assert.equal(wrong.body.error.code, "invalid_api_key");
    for (const p of ["/v1/models", "/v1/workers"]) {
      assert.equal((await fetch(`${url}${p}`)).status, 401, p);
      assert.equal((await fetch(`${url}${p}`, { headers: AUTH })).status, 200, p);
    }
    assert.equal((await fetch(`${url}/health`)).status, 200);
    assert.equal((await fetch(`${url}/ready`)).status, 200);
    // /metrics lists every worker's host:port: not for anyone without a key.
    const m = await fetch(`${url}/metrics`);
    assert.equal(m.status, 401);
    assert.equal(((await m.json()) as ErrorBody).error.type, "authentication_error");
    const mk = await fetch(`${url}/metrics`, { headers: AUTH });
    assert.equal(mk.status, 200);
    assert.match(await mk.text(), /infera_/);
    const bad = new OpenAI({ baseURL: `${url}/v1`, apiKey: "nope", maxRetries: 0 });
    await assert.rejects(
      bad.chat.completions.create({ model: "sim-model", messages: [{ role: "user", content: "x" }] }),
      (e: unknown) => e instanceof OpenAI.AuthenticationError,
    );
    const good = new OpenAI({ baseURL: `${url}/v1`, apiKey: "sk-test-1", maxRetries: 0 });
    const ok = await good.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "x" }],
      max_tokens: 1,
    });
    assert.equal(ok.choices.length, 1);
  });

  it("unknown paths → 404, wrong methods → 405, both OpenAI-shaped", async () => {
    const r404 = await fetch(`${url}/v1/nothing`, { headers: AUTH });
    assert.equal(r404.status, 404);
    assert.ok(((await r404.json()) as ErrorBody).error.message);
    const r405 = await fetch(`${url}/v1/chat/completions`, { headers: AUTH });
    assert.equal(r405.status, 405);
    assert.equal(((await r405.json()) as ErrorBody).error.code, "method_not_allowed");
  });

  it("aborted uploads and garbage on the socket do not crash the server", async () => {
    await new Promise<void>((resolve) => {
      const s = connect(c.server.port, "127.0.0.1", () => {
        s.write(
          'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 10000\r\nauthorization: Bearer sk-test-1\r\n\r\n{"model":',
        );
        setTimeout(() => {
          s.destroy();
          resolve();
        }, 50);
      });
      s.on("error", () => {});
    });
    const garbage = await new Promise<string>((resolve) => {
      const s = connect(c.server.port, "127.0.0.1", () => s.write("\x00\x01 NOT HTTP AT ALL\r\n\r\n"));
      let got = "";
      s.on("data", (d) => {
        got += d.toString();
      });
      s.on("close", () => resolve(got));
      s.on("error", () => {});
    });
    assert.match(garbage, /^HTTP\/1\.1 400/);
    const r = await post("/v1/chat/completions", chat({}));
    assert.equal(r.status, 200, "still serving");
  });
});
