/**
 * The route table (src/server/routes.ts, issue #33 item 1): one line per route, and the rules
 * every route gets from the dispatcher rather than from its handler: a known path asked with
 * another method is a 405 (OpenAI-shaped, code method_not_allowed), an unknown path a 404, GET
 * routes answer HEAD, and only /health and /ready answer without the API key. A route added to
 * the table is checked here without a line of test.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { type InferaServer, startServer } from "../../src/server/app.ts";
import { ROUTES } from "../../src/server/routes.ts";

const KEY = "sk-routes-test";
/** Liveness and readiness probes carry no key (kubelet). */
const PUBLIC = new Set(["/health", "/ready"]);

describe("the route table", () => {
  let server: InferaServer;
  before(async () => {
    server = await startServer(
      { port: 0, scrapeIntervalMs: 0, apiKeys: [KEY] },
      { discovery: new MemoryDiscovery([]) },
    );
  });
  after(async () => {
    await server?.close();
  });

  it("lists each method + path once, with the OpenAI endpoints among them", () => {
    const keys = ROUTES.map((r) => `${r.method} ${r.path}`);
    assert.equal(new Set(keys).size, keys.length);
    for (const k of ["POST /v1/chat/completions", "POST /v1/completions", "GET /health", "GET /v1/models"])
      assert.ok(keys.includes(k), k);
  });

  it("a known path asked with another method is a 405; an unknown path a 404", async () => {
    for (const r of ROUTES) {
      const res = await fetch(`${server.url}${r.path}`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${KEY}` },
      });
      assert.equal(res.status, 405, `DELETE ${r.path}`);
      const body = (await res.json()) as { error: { code: string } };
      assert.equal(body.error.code, "method_not_allowed");
    }
    for (const method of ["GET", "POST"]) {
      const res = await fetch(`${server.url}/v1/no-such-route`, {
        method,
        headers: { authorization: `Bearer ${KEY}` },
        body: method === "POST" ? "{}" : undefined,
      });
      assert.equal(res.status, 404, `${method} unknown path`);
      await res.arrayBuffer();
    }
  });

  it("GET routes answer HEAD; only /health and /ready answer without the key", async () => {
    for (const r of ROUTES) {
      const init: RequestInit =
        r.method === "POST"
          ? { method: "POST", headers: { "content-type": "application/json" }, body: "{}" }
          : { method: "GET" };
      const res = await fetch(`${server.url}${r.path}`, init);
      await res.arrayBuffer();
      if (PUBLIC.has(r.path)) assert.notEqual(res.status, 401, `${r.method} ${r.path}`);
      else assert.equal(res.status, 401, `${r.method} ${r.path} without the key`);
      if (r.method === "GET") {
        const head = await fetch(`${server.url}${r.path}`, {
          method: "HEAD",
          headers: { authorization: `Bearer ${KEY}` },
        });
        assert.ok(head.status !== 404 && head.status !== 405, `HEAD ${r.path}: ${head.status}`);
      }
    }
  });
});
