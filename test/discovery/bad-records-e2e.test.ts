/**
 * Issue #17, end to end: bad worker records registered in a real etcd next to a good one, for
 * the same model, must not fail requests for it. Before the schema check, `blockSize: 0`
 * made every request routed to it a 500 (RangeError in kv/hash), an `ftp://` url answered 500
 * forever without opening the breaker, and numeric served names leaked into /v1/models.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Etcd3 } from "etcd3";
import OpenAI from "openai";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { mixedRecord } from "../helpers/records.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { waitUntil } from "../helpers/wait.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

describe("bad worker records in etcd (end to end)", () => {
  let etcd: EtcdHandle;
  let sim: SimProcess;
  let server: InferaServer;
  let client: Etcd3;
  const prefix = "/bad-e2e";
  const MODEL = "bad-e2e-model";

  before(async () => {
    [etcd, sim] = await Promise.all([startEtcd(), startSim({ model: MODEL, args: ["--speed", "100"] })]);
    client = new Etcd3({ hosts: etcd.endpoint });
    const put = (id: string, o: Record<string, unknown> = {}) =>
      client
        .put(`${prefix}/workers/${MODEL}/${id}`)
        .value(JSON.stringify({ ...mixedRecord({ id, model: MODEL, url: sim.url }), ...o }));
    await put("good");
    await put("bs0", { blockSize: 0 });
    await put("ftp", { url: "ftp://127.0.0.1:21" });
    await put("numnames", { servedModelNames: [1, 2] });
    server = await startServer({
      port: 0,
      scrapeIntervalMs: 0,
      discovery: { kind: "etcd", etcdEndpoints: [etcd.endpoint], prefix },
    });
  });
  after(async () => {
    await server?.close();
    client?.close();
    await sim?.stop();
    await etcd?.dispose();
  });

  it("serves every request from the good worker; /v1/models lists only strings", async () => {
    await waitUntil(() => server.workers.size >= 1, 10_000, "the good worker");
    const openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
    let ok = 0;
    for (let i = 0; i < 12; i++) {
      const r = await openai.completions.create({ model: MODEL, prompt: `hello ${i}`, max_tokens: 2 });
      assert.equal(r.usage?.completion_tokens, 2);
      ok++;
    }
    const models = await openai.models.list();
    const ids = models.data.map((m) => m.id);
    assert.ok(
      ids.every((id) => typeof id === "string"),
      JSON.stringify(ids),
    );
    assert.deepEqual(ids, [MODEL]);
    assert.equal(ok, 12);
    assert.equal(server.workers.size, 1);
  });
});
