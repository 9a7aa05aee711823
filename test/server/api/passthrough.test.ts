/**
 * Pass-through routes (issue #31 item 3) and native Responses / Messages: only to workers whose
 * record lists the route, the body and the answer unchanged, a 404 naming the route where none
 * does; and GET /v1/models/{id}.
 *
 * /tokenize and /detokenize run against real sims (vLLM's shapes: vllm-project/vllm
 * vllm/entrypoints/serve/tokenize/protocol.py @ 343bacafc7bf4f973a105e8e7d99fa7de61f7e18,
 * TokenizeResponse {count, max_model_len, tokens}, DetokenizeResponse {prompt}). The pooling
 * routes run against a pooling engine stand-in that answers in vLLM's shapes
 * (vllm/entrypoints/pooling/embed/protocol.py @ ff8d577a972bbcd9bc37b196343f5f9a86609ccb,
 * EmbeddingResponse {id, object: "list", created, model, data: [{index, object: "embedding",
 * embedding}], usage}) and records what it received, since the sim is a generative model and,
 * like vLLM's, serves no pooling route.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { completeRecord } from "../../../src/discovery/static.ts";
import { type Cluster, startCluster } from "../cluster.ts";

const MODEL = "sim-model";
const POOL_MODEL = "embed-model";

interface Seen {
  path: string;
  body: string;
}

/** A pooling engine stand-in: answers the pooling routes and, for the native test, Responses. */
async function poolingEngine(): Promise<{ server: Server; url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString();
      seen.push({ path: req.url ?? "", body });
      const answers: Record<string, unknown> = {
        "/v1/embeddings": {
          id: "embd-1",
          object: "list",
          created: 1,
          model: POOL_MODEL,
          data: [{ index: 0, object: "embedding", embedding: [0.25, -0.5, 1] }],
          usage: { prompt_tokens: 2, total_tokens: 2, completion_tokens: 0 },
        },
        "/v1/rerank": {
          id: "rerank-1",
          model: POOL_MODEL,
          usage: { total_tokens: 5 },
          results: [{ index: 1, document: { text: "b" }, relevance_score: 0.9 }],
        },
        "/v1/score": { id: "score-1", object: "list", model: POOL_MODEL, data: [{ index: 0, score: 0.5 }] },
        "/v1/responses": { id: "resp_native", object: "response", status: "completed", output: [] },
      };
      const a = answers[req.url ?? ""];
      res.writeHead(a ? 200 : 404, { "content-type": "application/json" });
      res.end(JSON.stringify(a ?? { error: { message: "not found" } }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

describe("pass-through routes", () => {
  let c: Cluster;
  let pool: Awaited<ReturnType<typeof poolingEngine>>;
  const post = (path: string, body: unknown) =>
    fetch(`${c.server.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });

  before(async () => {
    c = await startCluster(2);
    // sim-0 lists the tokenizer routes; sim-1 does not (same engine, older record).
    c.memory.put({ ...c.records[0]!, routes: ["/tokenize", "/detokenize"] });
    pool = await poolingEngine();
    c.memory.put(
      completeRecord({
        id: "pool-0",
        url: pool.url,
        model: POOL_MODEL,
        servedModelNames: [POOL_MODEL],
        engine: "vllm",
        role: "mixed",
        routes: ["/v1/embeddings", "/v1/rerank", "/v1/score", "/v1/responses"],
      }),
    );
  });
  after(async () => {
    await c?.close();
    await new Promise((r) => pool?.server.close(r));
  });

  it("/tokenize and /detokenize go to a worker that lists them, and round-trip", async () => {
    for (let i = 0; i < 4; i++) {
      const r = await post("/tokenize", { model: MODEL, prompt: "hello world", add_special_tokens: false });
      assert.equal(r.status, 200);
      const t = (await r.json()) as { count: number; tokens: number[]; max_model_len: number };
      assert.equal(t.count, t.tokens.length);
      const d = await post("/detokenize", { model: MODEL, tokens: t.tokens });
      assert.equal(d.status, 200);
      assert.deepEqual(await d.json(), { prompt: "hello world" });
    }
  });

  it("no worker lists the route: 404 naming the route; unknown model: 404 model_not_found", async () => {
    const r = await post("/v1/embeddings", { model: MODEL, input: "x" });
    assert.equal(r.status, 404);
    const e = (await r.json()) as { error: { code: string; message: string } };
    assert.equal(e.error.code, "route_not_served");
    assert.match(e.error.message, /\/v1\/embeddings/);
    const u = await post("/v1/rerank", { model: "nope", query: "q", documents: ["a"] });
    assert.equal(u.status, 404);
    assert.equal(((await u.json()) as { error: { code: string } }).error.code, "model_not_found");
    // Without the record's route the sim is never asked, even though it would answer /tokenize.
    c.memory.put({ ...c.records[0]! });
    const none = await post("/tokenize", { model: MODEL, prompt: "x" });
    assert.equal(none.status, 404);
    c.memory.put({ ...c.records[0]!, routes: ["/tokenize", "/detokenize"] });
  });

  it("/v1/embeddings through the openai SDK; rerank and score relayed unchanged", async () => {
    const client = new OpenAI({ baseURL: `${c.server.url}/v1`, apiKey: "none", maxRetries: 0 });
    pool.seen.length = 0;
    const e = await client.embeddings.create({ model: POOL_MODEL, input: "hello", encoding_format: "float" });
    assert.deepEqual(e.data[0]?.embedding, [0.25, -0.5, 1]);
    const rerankBody = { model: POOL_MODEL, query: "q", documents: ["a", "b"], top_n: 1 };
    const rr = await post("/v1/rerank", rerankBody);
    assert.equal(rr.status, 200);
    assert.equal(((await rr.json()) as { results: Array<{ index: number }> }).results[0]?.index, 1);
    const sc = await post("/v1/score", { model: POOL_MODEL, text_1: "a", text_2: "b" });
    assert.equal(sc.status, 200);
    assert.deepEqual(
      pool.seen.map((s) => s.path),
      ["/v1/embeddings", "/v1/rerank", "/v1/score"],
    );
    assert.deepEqual(JSON.parse(pool.seen[1]!.body), rerankBody);
  });

  it("/v1/responses goes natively to a worker that lists it, the answer unchanged", async () => {
    pool.seen.length = 0;
    const body = { model: POOL_MODEL, input: "hi", max_output_tokens: 3 };
    const r = await post("/v1/responses", body);
    assert.equal(r.status, 200);
    assert.equal(((await r.json()) as { id: string }).id, "resp_native");
    assert.deepEqual(
      pool.seen.map((s) => [s.path, JSON.parse(s.body)]),
      [["/v1/responses", body]],
    );
  });

  it("GET /v1/models/{id}: the card, or 404 model_not_found", async () => {
    const client = new OpenAI({ baseURL: `${c.server.url}/v1`, apiKey: "none", maxRetries: 0 });
    const m = await client.models.retrieve(MODEL);
    assert.equal(m.id, MODEL);
    assert.equal(m.object, "model");
    await assert.rejects(client.models.retrieve("nope"), (e: unknown) => e instanceof OpenAI.NotFoundError);
  });
});
