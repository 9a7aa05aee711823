/**
 * Issue #17's input-side items as figures for the reliability table: bad worker records
 * (item 2), two etcd keys with one worker id (item 3), deep JSON (item 7), a 3 MB model name,
 * and broken worker answers. The same behaviours have focused tests beside their code
 * (test/discovery/records.test.ts, test/discovery/bad-records-e2e.test.ts,
 * test/server/hardening.test.ts); here each is measured once against real processes and
 * recorded with its goal.
 */
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { Etcd3 } from "etcd3";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { misbehavingWorker } from "../helpers/broken-worker.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { mixedRecord } from "../helpers/records.ts";
import { waitUntil } from "../helpers/wait.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
fileStarted(import.meta.url);

let worker: ReturnType<typeof misbehavingWorker>;
let url: string;
let server: InferaServer;
let etcd: EtcdHandle | undefined;

before(async () => {
  worker = misbehavingWorker();
  await new Promise<void>((r) => worker.server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(worker.server.address() as AddressInfo).port}`;
  const good = (id: string, model: string): WorkerRecord => mixedRecord({ id, model, url });
  // Bad records beside the good one for model "m" (item 2): the memory backend validates too.
  const memory = new MemoryDiscovery([
    good("good", "m"),
    { ...good("bs0", "m"), blockSize: 0 },
    { ...good("ftp", "m"), url: "ftp://127.0.0.1:21" },
    { ...good("nums", "m"), servedModelNames: [1, 2] as unknown as string[] },
    good("bad-json", "bad-json"),
    good("bad-status", "bad-status"),
    good("garbage-sse", "garbage-sse"),
  ]);
  server = await startServer({ port: 0, scrapeIntervalMs: 0, policy: "kv-aware" }, { discovery: memory });
});

after(async () => {
  await server?.close();
  worker?.release();
  for (const s of worker?.sockets ?? []) s.destroy();
  await new Promise((r) => worker?.server.close(r));
  await etcd?.dispose();
  fileDone(import.meta.url);
});

const post = (body: string) =>
  fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
const chat = (model: string, extra: Record<string, unknown> = {}) =>
  post(JSON.stringify({ model, messages: [{ role: "user", content: "hello" }], ...extra }));

test("bad worker records beside a good one: the model keeps being served", async () => {
  let failed = 0;
  const n = 40;
  for (let i = 0; i < n; i++) {
    const r = await chat("m");
    await r.arrayBuffer();
    if (r.status !== 200) failed++;
  }
  const models = (await (await fetch(`${server.url}/v1/models`)).json()) as { data: { id: unknown }[] };
  const ids = models.data.map((m) => m.id);
  const stringsOnly = ids.every((id) => typeof id === "string");
  const served = server.workers.list().map((w) => w.record.id);
  const pass = failed === 0 && stringsOnly && served.includes("good") && !served.includes("bs0");
  record(
    import.meta.url,
    "bad worker records (blockSize 0, ftp:// url, numeric names)",
    `${failed}/${n} requests failed; /v1/models ids ${JSON.stringify(ids)}; served ${served.length} of 7 records`,
    "0 failed; only valid records served; /v1/models lists strings only",
    pass,
  );
  assert.ok(pass);
});

test("two etcd keys with one worker id: deleting the duplicate keeps the worker", async () => {
  etcd = await startEtcd();
  const prefix = "/dup-rel";
  const client = new Etcd3({ hosts: etcd.endpoint });
  const watcher = new EtcdWatcher({ endpoints: [etcd.endpoint], prefix });
  try {
    const key = (name: string) => `${prefix}/workers/dm/${name}`;
    await client.put(key("a")).value(JSON.stringify(mixedRecord({ id: "dup", model: "dm", url })));
    await client
      .put(key("b"))
      .value(JSON.stringify(mixedRecord({ id: "dup", model: "dm", url: "http://127.0.0.1:9" })));
    await watcher.start();
    const dup = () => watcher.workers().find((w) => w.id === "dup");
    await waitUntil(() => dup() !== undefined, 5000, "the worker");
    const first = dup()?.url;
    await client.delete().key(key("b"));
    await new Promise((r) => setTimeout(r, 300));
    const afterDuplicateGone = dup()?.url;
    await client
      .put(key("b"))
      .value(JSON.stringify(mixedRecord({ id: "dup", model: "dm", url: "http://127.0.0.1:9" })));
    await client.delete().key(key("a"));
    await waitUntil(() => dup()?.url === "http://127.0.0.1:9", 5000, "the other key's record back");
    const pass = first === url && afterDuplicateGone === url;
    record(
      import.meta.url,
      "duplicate worker id under two etcd keys",
      `served ${first === url ? "the first-created key" : first}; after deleting the duplicate: ${afterDuplicateGone === url ? "still served" : "lost"}; after deleting the winner: the other key's record served`,
      "the worker survives the duplicate's deletion; the rule (first created wins) is deterministic",
      pass,
    );
    assert.ok(pass);
  } finally {
    await watcher.close();
    client.close();
  }
});

test("deep JSON, a 3 MB model name, broken worker answers: clear errors, no crash", async () => {
  const deep = (d: number) =>
    `{"model":"m","messages":[{"role":"user","content":"x"}],"x":${"[".repeat(d)}${"]".repeat(d)}}`;
  const depthStatus: number[] = [];
  for (const d of [1_000, 100_000]) {
    const r = await post(deep(d));
    await r.arrayBuffer();
    depthStatus.push(r.status);
  }
  const long = await chat("m".repeat(3 * 1024 * 1024 - 200));
  const longBody = await long.text();
  const broken: string[] = [];
  for (const model of ["bad-json", "bad-status"]) {
    const r = await chat(model);
    const j = (await r.json()) as { error?: { code?: string } };
    broken.push(`${model} → ${r.status} ${j.error?.code ?? "?"}`);
  }
  const sse = await chat("garbage-sse", { stream: true });
  const sseText = await sse.text();
  const sseOk = sse.status === 200 && /"error"/.test(sseText) && /data: \[DONE\]/.test(sseText);
  const healthy = (await fetch(`${server.url}/health`)).status === 200;
  const pass =
    depthStatus.every((s) => s === 400) &&
    long.status === 404 &&
    longBody.length < 2000 &&
    broken.every((b) => / 502 upstream_invalid_response$/.test(b)) &&
    sseOk &&
    healthy;
  record(
    import.meta.url,
    "hostile bodies and broken worker answers",
    `nesting 1k/100k → ${depthStatus.join("/")}; 3 MB model name → ${long.status} with a ${longBody.length}-byte body; ${broken.join(", ")}; garbage SSE → error event + [DONE]: ${sseOk}; server healthy after: ${healthy}`,
    "deep nesting 400; long names not echoed (< 2 KB); invalid answers 502 in OpenAI's shape; stream gets error + [DONE]",
    pass,
  );
  assert.ok(pass);
});
