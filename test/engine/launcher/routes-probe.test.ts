/**
 * The launcher asks a healthy engine which extra routes it serves (the record's `routes`): a
 * POST of `{}` per route. FastAPI (vLLM, SGLang, ATOM) answers an unknown path 404
 * (starlette/routing.py `Router.not_found`) and a known one with a validation error (vLLM turns
 * RequestValidationError into 400: vllm-project/vllm vllm/entrypoints/openai/api_server.py;
 * plain FastAPI 422); 401 (an engine's API key in front of every /v1 path) and 501 (vLLM's
 * answer when the model does not support the API) say nothing, so those routes are left out.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, describe, it } from "node:test";
import { probeRoutes } from "../../../src/engine/launcher/routes-probe.ts";
import { type SimProcess, startSim } from "../../helpers/sim.ts";

describe("routes probe", () => {
  const servers: Server[] = [];
  const sims: SimProcess[] = [];
  after(async () => {
    for (const s of servers) s.close();
    await Promise.all(sims.map((s) => s.stop()));
  });

  it("keeps the routes that answer other than 401/403/404/405/5xx", async () => {
    const status: Record<string, number> = {
      "/v1/embeddings": 422,
      "/v1/rerank": 400,
      "/v1/score": 200,
      "/v1/responses": 401,
      "/v1/messages": 501,
      "/tokenize": 405,
    };
    const srv = createServer((req, res) => {
      req.resume();
      res.writeHead(status[req.url ?? ""] ?? 404).end("{}");
    });
    servers.push(srv);
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const base = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
    assert.deepEqual(await probeRoutes(base), ["/v1/embeddings", "/v1/rerank", "/v1/score"]);
  });

  it("a sim (vLLM personality, generative) serves Responses, Messages and the tokenizer routes", async () => {
    const sim = await startSim({ timeoutMs: 60_000 });
    sims.push(sim);
    assert.deepEqual((await probeRoutes(sim.url)).sort(), [
      "/detokenize",
      "/tokenize",
      "/v1/messages",
      "/v1/responses",
    ]);
  });

  it("a sim with SGLang's personality serves Responses, not Messages", async () => {
    const sim = await startSim({ timeoutMs: 60_000, engine: "sglang" });
    sims.push(sim);
    const routes = await probeRoutes(sim.url);
    assert.ok(routes.includes("/v1/responses"));
    assert.ok(!routes.includes("/v1/messages"));
  });

  it("nothing listening: no routes", async () => {
    assert.deepEqual(await probeRoutes("http://127.0.0.1:1"), []);
  });
});
