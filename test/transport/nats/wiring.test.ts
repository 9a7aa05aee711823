import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import type { NatsConnection } from "@nats-io/transport-node";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { builtinExtensions } from "../../../src/server/builtin-extensions.ts";
import { mergeConfig } from "../../../src/server/config.ts";
import { type NatsRequestAgent, startRequestAgent } from "../../../src/transport/nats/agent.ts";
import { NatsRequestExecutor } from "../../../src/transport/nats/client.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { startKvRelay } from "../../../src/transport/nats/kv-relay.ts";
import { startKvSubscriber } from "../../../src/transport/nats/kv-subscriber.ts";
import { selectKvIngestFactory } from "../../../src/transport/nats/server-plug.ts";
import { kvSubject, requestSubject } from "../../../src/transport/nats/subjects.ts";
import { engineListenArgs } from "../../helpers/launcher.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { freePort } from "../../helpers/ports.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { type SimProcess, simWorkerRecord, startSim } from "../../helpers/sim.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
const INFERA = fileURLToPath(new URL("../../../bin/infera.js", import.meta.url));
const MODEL = "wired-model";

let nats: NatsServerHandle;
let nc: NatsConnection;
const cleanups: (() => unknown)[] = [];

before(async () => {
  nats = await startNats({ token: "tok-1" });
  nc = await connectNats({ url: nats.url, token: "tok-1" });
});
after(async () => {
  for (const c of cleanups.reverse()) await c();
  await nc.close();
  await nats.close();
});

test("server config: a NATS URL makes both planes nats unless told otherwise", () => {
  const c = mergeConfig({ nats: { url: "nats://h:1" } });
  assert.equal(c.requestPlane, "nats");
  assert.equal(c.eventPlane, "nats");
  const d = mergeConfig({ nats: { url: "nats://h:1" }, requestPlane: "http", eventPlane: "zmq" });
  assert.equal(d.requestPlane, "http");
  assert.equal(d.eventPlane, "zmq");
  const e = mergeConfig({});
  assert.equal(e.requestPlane, "http");
  assert.equal(e.eventPlane, undefined);
});

test("infera server over --request-plane nats serves the openai client through the agent", async () => {
  const sim: SimProcess = await startSim({ model: MODEL });
  cleanups.push(() => sim.stop());
  const agent: NatsRequestAgent = await startRequestAgent({
    nc,
    engineUrl: sim.url,
    model: MODEL,
    workerId: "w1",
  });
  cleanups.push(() => agent.close());
  const rec: WorkerRecord = mixedRecord({
    id: "w1",
    model: MODEL,
    // Unreachable on purpose: only the NATS subject can serve this worker.
    url: "http://127.0.0.1:9",
    natsSubject: agent.subject,
  });
  // A second worker whose agent is gone: its requests must fail over to w1 (the HTTP retry path).
  const ghost: WorkerRecord = { ...rec, id: "w0-ghost", natsSubject: requestSubject(MODEL, "w0-ghost") };
  const discovery = new MemoryDiscovery([rec, ghost]);
  const server: InferaServer = await startServer(
    { port: 0, scrapeIntervalMs: 0, nats: { url: nats.url, token: "tok-1" } },
    { discovery },
  );
  cleanups.push(() => server.close());
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "x", maxRetries: 0 });
  const r = await client.completions.create({ model: MODEL, prompt: "over nats", max_tokens: 6, seed: 4 });
  assert.equal(r.usage?.completion_tokens, 6);
  const direct = (await (
    await fetch(`${sim.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, prompt: "over nats", max_tokens: 6, seed: 4 }),
    })
  ).json()) as { choices: { text: string }[] };
  assert.equal(r.choices[0].text, direct.choices[0].text);
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "stream it" }],
    max_tokens: 5,
    stream: true,
  });
  let text = "";
  for await (const ch of stream) text += ch.choices[0]?.delta?.content ?? "";
  assert.ok(text.length > 0);
  // Round-robin sends some of these to the ghost first; every one still succeeds via w1.
  for (let i = 0; i < 4; i++) {
    const again = await client.completions.create({ model: MODEL, prompt: `retry ${i}`, max_tokens: 2 });
    assert.equal(again.usage?.completion_tokens, 2);
  }
  assert.equal(agent.handled, 6);
});

test("on the nats plane, a worker without natsSubject is still served (over HTTP)", async () => {
  const sim: SimProcess = await startSim({ model: MODEL });
  cleanups.push(() => sim.stop());
  const rec: WorkerRecord = mixedRecord({ id: "http-only", model: MODEL, url: sim.url });
  const server: InferaServer = await startServer(
    { port: 0, scrapeIntervalMs: 0, nats: { url: nats.url, token: "tok-1" } },
    { discovery: new MemoryDiscovery([rec]) },
  );
  cleanups.push(() => server.close());
  assert.equal(server.config.requestPlane, "nats");
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "x", maxRetries: 0 });
  const r = await client.completions.create({ model: MODEL, prompt: "plain http", max_tokens: 3 });
  assert.equal(r.usage?.completion_tokens, 3);
});

function waitLine(proc: ChildProcess, re: RegExp, ms: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let buf = "";
    const t = setTimeout(() => reject(new Error(`no ${re} within ${ms} ms: ${buf.slice(-800)}`)), ms);
    const on = (d: Buffer) => {
      buf += d.toString();
      if (re.test(buf)) {
        clearTimeout(t);
        resolve();
      }
    };
    proc.stdout?.on("data", on);
    proc.stderr?.on("data", on);
  });
}

test("infera engine sim --nats-url runs the agent and the KV relay beside the engine", async () => {
  const port = await freePort();
  const proc = spawn(
    process.execPath,
    [
      INFERA,
      "engine",
      "sim",
      "--model",
      MODEL,
      "--worker-id",
      "launched.1",
      ...(await engineListenArgs(port)),
      "--discovery",
      "none",
      "--nats-url",
      nats.url,
    ],
    {
      env: { ...process.env, INFERA_LOG_LEVEL: "info", INFERA_NATS_TOKEN: "tok-1" },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  cleanups.push(async () => {
    proc.kill("SIGTERM");
    await exited;
  });
  await waitLine(proc, /nats kv relay ready/, 25_000);
  const exec = new NatsRequestExecutor({ nc });
  cleanups.push(() => exec.close());
  const seen: number[] = [];
  const sub = await startKvSubscriber({
    nc,
    subject: kvSubject(MODEL, "launched.1"),
    sink: { onBatch: (seq) => seen.push(seq), onReset: () => {} },
  });
  cleanups.push(() => sub.close());
  const worker = {
    record: {
      id: "launched.1",
      model: MODEL,
      url: `http://127.0.0.1:${port}`,
      natsSubject: requestSubject(MODEL, "launched.1"),
    } as WorkerRecord,
    inFlight: 0,
    pendingPrefillTokens: 0,
    available: true,
  };
  const up = await exec.send(
    worker,
    "completion",
    {
      model: MODEL,
      prompt: "a prompt long enough to fill at least one block of sixteen tokens, surely",
      max_tokens: 4,
    },
    { signal: new AbortController().signal },
  );
  assert.equal(up.status, 200);
  const body = (await up.json()) as { usage: { completion_tokens: number } };
  assert.equal(body.usage.completion_tokens, 4);
  const end = Date.now() + 5000;
  while (seen.length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 25));
  assert.ok(seen.length > 0, "KV batches arrived over NATS");
  assert.equal(seen[0], 0);
});

test("infera server --policy kv-aware --event-plane nats routes by the KV events the relays carry", async () => {
  const sims: SimProcess[] = [];
  const agents: NatsRequestAgent[] = [];
  const recs: WorkerRecord[] = [];
  for (const id of ["kv-a", "kv-b"]) {
    const sim = await startSim({ model: MODEL, args: ["--speed", "50"] });
    cleanups.push(() => sim.stop());
    sims.push(sim);
    const agent = await startRequestAgent({ nc, engineUrl: sim.url, model: MODEL, workerId: id });
    cleanups.push(() => agent.close());
    agents.push(agent);
    const rec: WorkerRecord = {
      ...simWorkerRecord(sim, { id, model: MODEL, maxModelLen: 8192 }),
      natsSubject: agent.subject,
    };
    recs.push(rec);
    const relay = await startKvRelay({ nc, model: MODEL, workerId: id, events: rec.kvEvents! });
    cleanups.push(() => relay.close());
  }
  await new Promise((r) => setTimeout(r, 200)); // the relays' ZMQ SUB sockets connect
  // The document is cached on kv-b only (sent to its engine directly, not through the server).
  const doc = "A long shared document about subjects, inboxes and credit windows. ".repeat(12);
  const warm = await fetch(`${sims[1].url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt: `${doc}first`, max_tokens: 2 }),
  });
  await warm.arrayBuffer();
  const server: InferaServer = await startServer(
    { port: 0, scrapeIntervalMs: 0, policy: "kv-aware", nats: { url: nats.url, token: "tok-1" } },
    // The NATS selector over whatever ZMQ ingest is built in (idempotent if it already is one).
    {
      discovery: new MemoryDiscovery(recs),
      extensions: { kvIngestFactory: selectKvIngestFactory(builtinExtensions.kvIngestFactory) },
    },
  );
  cleanups.push(() => server.close());
  assert.equal(server.config.eventPlane, "nats");
  const index = (
    server.kvIngest as unknown as { indexFor(m: string): { blockCount(id: string): number } }
  ).indexFor(MODEL);
  const end = Date.now() + 8000;
  while (index.blockCount("kv-b") === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 25));
  assert.ok(index.blockCount("kv-b") > 0, "kv-b's blocks reached the server over NATS (replayed on start)");
  assert.equal(index.blockCount("kv-a"), 0);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "x", maxRetries: 0 });
  const before = agents.map((a) => a.handled);
  for (let i = 0; i < 3; i++) {
    await client.completions.create({ model: MODEL, prompt: `${doc}question ${i}`, max_tokens: 2 });
  }
  // Without the events the tie would go to kv-a (lowest id); with them every one goes to kv-b.
  assert.deepEqual(
    agents.map((a, i) => a.handled - before[i]),
    [0, 3],
  );
});
