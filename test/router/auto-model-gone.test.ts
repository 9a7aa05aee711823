/**
 * Issue #30 item 12: when every worker of a model the server was serving leaves discovery
 * (the fleet of `infera up` killed, leases expired), requests got 404 model_not_found, which
 * SDKs never retry. Now a model seen within `modelGoneRetryS` is answered 503
 * no_worker_available with Retry-After (OpenAI error shape), like static workers that are down;
 * a name never served is still 404, and so is everything with the window off.
 */
import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import { type Cluster, startCluster, waitFor } from "../server/cluster.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

async function ask(url: string, model: string) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 2 }),
  });
  const body = (await res.json()) as { error?: { code?: string; type?: string; message?: string } };
  return { status: res.status, retryAfter: res.headers.get("retry-after"), body };
}

describe("a model whose workers all left (issue #30 item 12)", () => {
  const clusters: Cluster[] = [];
  after(async () => {
    await Promise.all(clusters.map((c) => c.close()));
  });

  it("is answered 503 no_worker_available with Retry-After, then served again when a worker returns", async () => {
    const c = await startCluster(1);
    clusters.push(c);
    const model = c.records[0]!.model;
    assert.equal((await ask(c.server.url, model)).status, 200);
    c.memory.remove(c.records[0]!.id);
    await waitFor(() => !c.server.router.knows(model), 5000, "worker removed");
    const r = await ask(c.server.url, model);
    assert.equal(r.status, 503, JSON.stringify(r.body));
    assert.equal(r.body.error?.code, "no_worker_available");
    assert.equal(r.body.error?.type, "service_unavailable");
    assert.ok(Number(r.retryAfter) >= 1, `retry-after: ${r.retryAfter}`);
    // The openai client retries a 503 (and honours Retry-After): it gets the answer once the
    // worker is back within its retries.
    const retried = c.client.withOptions({ maxRetries: 3 }).chat.completions.create({
      model,
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
    });
    setTimeout(() => c.memory.put(c.records[0]!), 500);
    assert.equal((await retried).usage?.completion_tokens, 2);
    // A name never served stays 404.
    const never = await ask(c.server.url, "never-served");
    assert.equal(never.status, 404);
    assert.equal(never.body.error?.code, "model_not_found");
  });

  it("with modelGoneRetryS 0 a vanished model is 404 as before", async () => {
    const c = await startCluster(1, { config: { modelGoneRetryS: 0 } });
    clusters.push(c);
    const model = c.records[0]!.model;
    c.memory.remove(c.records[0]!.id);
    await waitFor(() => !c.server.router.knows(model), 5000, "worker removed");
    const r = await ask(c.server.url, model);
    assert.equal(r.status, 404);
    assert.equal(r.body.error?.code, "model_not_found");
  });
});
