import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { simRecord, waitFor } from "./cluster.ts";

async function modelIds(url: string): Promise<string[]> {
  const body = (await (await fetch(`${url}/v1/models`)).json()) as {
    object: string;
    data: Array<{ id: string; object: string }>;
  };
  assert.equal(body.object, "list");
  for (const m of body.data) assert.equal(m.object, "model");
  return body.data.map((m) => m.id).sort();
}

describe("the live worker set follows discovery", () => {
  const sims: SimProcess[] = [];
  const servers: InferaServer[] = [];
  let dir = "";
  before(async () => {
    sims.push(await startSim({ model: "alpha", args: ["--speed", "100"] }));
    sims.push(
      await startSim({
        model: "beta",
        args: ["--speed", "100", "--served-model-name", "beta", "beta-alias"],
      }),
    );
    dir = mkdtempSync(join(tmpdir(), "infera-disc-"));
  });
  after(async () => {
    await Promise.all(servers.map((s) => s.close()));
    await Promise.all(sims.map((s) => s.stop()));
    rmSync(dir, { recursive: true, force: true });
  });

  it("memory: /v1/models and /ready follow workers coming and going", async () => {
    const memory = new MemoryDiscovery();
    const server = await startServer({ port: 0, scrapeIntervalMs: 0 }, { discovery: memory });
    servers.push(server);
    assert.equal((await fetch(`${server.url}/ready`)).status, 503);
    assert.deepEqual(await modelIds(server.url), []);
    memory.put(simRecord(sims[0]!, 0, "alpha"));
    assert.equal((await fetch(`${server.url}/ready`)).status, 200);
    assert.deepEqual(await modelIds(server.url), ["alpha"]);
    memory.put({ ...simRecord(sims[1]!, 1, "beta"), servedModelNames: ["beta", "beta-alias"] });
    assert.deepEqual(await modelIds(server.url), ["alpha", "beta", "beta-alias"]);
    const res = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({
        model: "beta-alias",
        messages: [{ role: "user", content: "x" }],
        max_tokens: 1,
      }),
    });
    assert.equal(res.status, 200);
    await res.text();
    memory.remove("sim-0");
    assert.deepEqual(await modelIds(server.url), ["beta", "beta-alias"]);
    const gone = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ model: "alpha", messages: [{ role: "user", content: "x" }] }),
    });
    // A model that was served and whose workers all left is 503 + Retry-After (issue #30
    // item 12; auto-model-gone.test.ts), not 404: its workers may be restarting.
    assert.equal(gone.status, 503);
    assert.ok(gone.headers.get("retry-after"));
    await gone.text();
    memory.remove("sim-1");
    assert.equal((await fetch(`${server.url}/ready`)).status, 503);
    const workers = (await (await fetch(`${server.url}/v1/workers`)).json()) as { data: unknown[] };
    assert.deepEqual(workers.data, []);
  });

  it("static --worker URL learns served names from the worker's /v1/models", async () => {
    const server = await startServer(
      { port: 0, scrapeIntervalMs: 50, discovery: { workers: [sims[1]!.url] } },
      {},
    );
    servers.push(server);
    assert.equal(server.config.discovery.kind, "static");
    assert.deepEqual(await modelIds(server.url), ["beta", "beta-alias"]);
    const w = server.workers.list()[0]!;
    assert.equal(w.record.model, "beta");
    assert.equal(w.record.role, "mixed");
    // The load scraper fills engineLoad from the sim's vLLM gauges.
    await waitFor(() => w.engineLoad !== undefined, 3000, "engine load scrape");
    assert.equal(w.engineLoad!.running, 0);
  });

  it("static --workers-file (YAML) with partial records; an unreachable worker is left out until it answers", async () => {
    const file = join(dir, "workers.yaml");
    const late = await import("../helpers/ports.ts").then((m) => m.freePort());
    writeFileSync(
      file,
      [
        `- url: ${sims[0]!.url}`,
        "  model: alpha",
        "  servedModelNames: [alpha]",
        "  role: prefill",
        "  connector: { kind: nixl, bootstrapHost: 127.0.0.1, bootstrapPort: 5600 }",
        `  kvEvents: { endpoint: "${sims[0]!.kvEndpoint}", topic: kv-events, framing: seq }`,
        "  blockSize: 32",
        `- url: http://127.0.0.1:${late}`,
        "",
      ].join("\n"),
    );
    const server = await startServer({ port: 0, scrapeIntervalMs: 0, discovery: { workersFile: file } });
    servers.push(server);
    const list = server.workers.list();
    assert.equal(list.length, 1);
    const rec = list[0]!.record;
    assert.equal(rec.role, "prefill");
    assert.equal(rec.connector.kind, "nixl");
    assert.equal(rec.connector.bootstrapPort, 5600);
    assert.equal(rec.blockSize, 32);
    assert.equal(rec.kvEvents?.endpoint, sims[0]!.kvEndpoint);
    // No DisaggRouter and only a prefill worker: the MixedRouter still serves the model.
    assert.equal(server.router.kindFor("alpha"), "mixed");
  });
});
