/**
 * A worker killed with -9 (launcher and engine together, so nothing deregisters it) with
 * etcd discovery and no traffic to trip the breaker: the server drops it when its lease
 * expires, ≤ the lease TTL after the kill (plus etcd's 500 ms expiry tick), and keeps
 * serving on the other worker.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import OpenAI from "openai";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { waitUntil } from "../helpers/wait.ts";
import { type LaunchedWorker, launchWorker } from "./fleet.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
process.env.INFERA_LOG_LEVEL ??= "silent";

const TTL_S = 2;
let etcd: EtcdHandle | undefined;
let server: InferaServer | undefined;
const workers: LaunchedWorker[] = [];
after(async () => {
  for (const w of workers) w.killGroup();
  await server?.close();
  await etcd?.dispose();
  fileDone(import.meta.url);
});

test("kill -9 with etcd discovery: out of the server's set ≤ lease TTL", { timeout: 60_000 }, async () => {
  etcd = await startEtcd();
  const prefix = "/rel-kill";
  for (const id of ["w-a", "w-b"]) {
    workers.push(await launchWorker({ id, etcd: etcd.endpoint, prefix, leaseTtlS: TTL_S }));
  }
  server = await startServer({
    port: 0,
    scrapeIntervalMs: 0,
    discovery: { kind: "etcd", etcdEndpoints: [etcd.endpoint], prefix },
  });
  const s = server;
  await waitUntil(() => s.workers.size === 2, 30_000, "both workers registered").catch((err) => {
    throw new Error(`${(err as Error).message}\n${workers.map((w) => w.output()).join("\n")}`);
  });
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0 });
  const ask = () =>
    client.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
    });
  await Promise.all([ask(), ask()]);
  // Let a keep-alive go out, so the lease has a fresh TTL: the worst case for the figure.
  await new Promise((r) => setTimeout(r, 300));

  const killedAt = performance.now();
  workers[1]!.killGroup();
  await waitUntil(() => s.workers.get("w-b") === undefined, TTL_S * 1000 + 3000, "w-b to leave", 5);
  const goneMs = performance.now() - killedAt;
  const results = await Promise.allSettled(Array.from({ length: 8 }, ask));
  const failed = results.filter((r) => r.status === "rejected").length;

  const limitMs = TTL_S * 1000 + 500;
  const pass = goneMs <= limitMs && failed === 0;
  record(
    import.meta.url,
    "worker kill -9 (etcd lease)",
    `removed ${goneMs.toFixed(0)} ms after kill -9 (lease TTL ${TTL_S} s); ${failed}/8 failed after`,
    `≤ ${limitMs} ms (TTL + etcd 500 ms tick), 0 failed`,
    pass,
  );
  assert.ok(goneMs <= limitMs, `removed after ${goneMs} ms`);
  assert.equal(failed, 0);
});
