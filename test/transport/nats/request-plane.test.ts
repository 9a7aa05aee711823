import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import type { UpstreamResponse, WorkerState } from "../../../src/router/types.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { type NatsRequestAgent, startRequestAgent } from "../../../src/transport/nats/agent.ts";
import { NatsRequestExecutor } from "../../../src/transport/nats/client.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { requestSubject } from "../../../src/transport/nats/subjects.ts";
import { WorkerUnreachableError } from "../../../src/transport/types.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
const MODEL = "sim.model/v1";

let nats: NatsServerHandle;
let sim: SimProcess;
let ncAgent: NatsConnection;
let ncClient: NatsConnection;
let agent: NatsRequestAgent;
let nexec: NatsRequestExecutor;
const hexec = new HttpExecutor();
let worker: WorkerState;

function state(rec: Partial<WorkerRecord> & { id: string; url: string }): WorkerState {
  const record: WorkerRecord = mixedRecord({ model: MODEL, ...rec });
  return { record, inFlight: 0, pendingPrefillTokens: 0, available: true };
}

before(async () => {
  nats = await startNats();
  // Slow enough that a stream lasts long enough to abort it; fast enough for short tests.
  sim = await startSim({ model: MODEL, args: ["--speed", "5"] });
  ncAgent = await connectNats({ url: nats.url, name: "agent" });
  ncClient = await connectNats({ url: nats.url, name: "server" });
  agent = await startRequestAgent({ nc: ncAgent, engineUrl: sim.url, model: MODEL, workerId: "w1" });
  nexec = new NatsRequestExecutor({ nc: ncClient, pingMs: 200, acceptTimeoutMs: 500 });
  worker = state({ id: "w1", url: sim.url, natsSubject: agent.subject });
});

after(async () => {
  nexec.close();
  await agent.close();
  await hexec.close();
  await ncAgent.close();
  await ncClient.close();
  await sim.stop();
  await nats.close();
});

const signal = () => new AbortController().signal;

async function readAll(up: UpstreamResponse): Promise<string> {
  let s = "";
  for await (const c of up.body) s += Buffer.from(c).toString("utf8");
  return s;
}

/**
 * The content of an SSE stream: the concatenated text, finish reasons, usage, and whether it
 * ended with [DONE]. Not the chunking: the sim may coalesce tokens into fewer events from run
 * to run, whatever the transport.
 */
function sseContent(text: string): {
  text: string;
  finish: unknown[];
  usage: unknown;
  done: boolean;
  events: number;
} {
  let out = "";
  const finish: unknown[] = [];
  let usage: unknown = null;
  let done = false;
  let events = 0;
  for (const ev of text.split("\n\n")) {
    if (!ev.startsWith("data: ")) continue;
    events++;
    const data = ev.slice(6);
    if (data === "[DONE]") {
      done = true;
      continue;
    }
    const j = JSON.parse(data) as {
      choices: { text?: string; delta?: { content?: string }; finish_reason?: unknown }[];
      usage?: unknown;
    };
    for (const c of j.choices) {
      out += c.text ?? c.delta?.content ?? "";
      if (c.finish_reason) finish.push(c.finish_reason);
    }
    if (j.usage) usage = j.usage;
  }
  return { text: out, finish, usage, done, events };
}

test("non-streamed completion over NATS matches HTTP (text and usage)", async () => {
  const body = { model: MODEL, prompt: "The quick brown fox jumps over", max_tokens: 24, seed: 7 };
  const viaHttp = await hexec.send(worker, "completion", body, { signal: signal() });
  const viaNats = await nexec.send(worker, "completion", body, { signal: signal() });
  assert.equal(viaNats.status, viaHttp.status);
  assert.match(viaNats.headers["content-type"] ?? "", /application\/json/);
  const a = (await viaHttp.json()) as { choices: { text: string }[]; usage: unknown };
  const b = (await viaNats.json()) as { choices: { text: string }[]; usage: unknown };
  assert.ok(a.choices[0].text.length > 0);
  assert.deepEqual(b.choices, a.choices);
  assert.deepEqual(b.usage, a.usage);
});

test("pass-through routes over NATS reach the engine's own path (/tokenize, /detokenize)", async () => {
  // The agent maps the endpoint header to the engine's path (ENDPOINT_PATHS); before, anything
  // but `completion` went to /v1/chat/completions.
  const tok = await nexec.send(
    worker,
    "tokenize",
    { model: MODEL, prompt: "hello world" },
    { signal: signal() },
  );
  assert.equal(tok.status, 200);
  const t = (await tok.json()) as { tokens: number[]; count: number };
  assert.equal(t.count, t.tokens.length);
  const viaHttp = (await (
    await hexec.send(worker, "tokenize", { model: MODEL, prompt: "hello world" }, { signal: signal() })
  ).json()) as { tokens: number[] };
  assert.deepEqual(t.tokens, viaHttp.tokens);
  const de = await nexec.send(worker, "detokenize", { model: MODEL, tokens: t.tokens }, { signal: signal() });
  assert.equal(de.status, 200);
  assert.equal(typeof ((await de.json()) as { prompt: string }).prompt, "string");
});

test("streamed chat over NATS matches HTTP (text, finish reason, usage)", async () => {
  const body = {
    model: MODEL,
    messages: [{ role: "user", content: "Tell me about NATS and HTTP." }],
    max_tokens: 40,
    seed: 11,
    stream: true,
    stream_options: { include_usage: true },
  };
  // Separate cache salts, so the second request does not get the first one's prefix-cache hits.
  const a = sseContent(
    await readAll(await hexec.send(worker, "chat", { ...body, cache_salt: "http" }, { signal: signal() })),
  );
  const up = await nexec.send(
    worker,
    "chat",
    { ...body, cache_salt: "nats" },
    { signal: signal(), headers: { "x-request-id": "rid-1" } },
  );
  assert.equal(up.status, 200);
  assert.match(up.headers["content-type"] ?? "", /text\/event-stream/);
  const b = sseContent(await readAll(up));
  assert.ok(a.text.length > 40 && a.usage !== null, JSON.stringify(a));
  assert.ok(b.events >= 3, `events: ${b.events}`);
  assert.equal(b.text, a.text);
  assert.deepEqual(b.finish, a.finish);
  assert.deepEqual(b.usage, a.usage);
  assert.equal(b.done, true);
});

test("engine errors (4xx) come back with their status and body", async () => {
  const up = await nexec.send(
    worker,
    "completion",
    { model: MODEL, prompt: "x", max_tokens: -3 },
    { signal: signal() },
  );
  const ref = await hexec.send(
    worker,
    "completion",
    { model: MODEL, prompt: "x", max_tokens: -3 },
    { signal: signal() },
  );
  assert.equal(up.status, ref.status);
  assert.ok(up.status >= 400 && up.status < 500);
  assert.deepEqual(await up.json(), await ref.json());
});

async function running(): Promise<number> {
  return parseMetric(await sim.metrics(), "vllm:num_requests_running") ?? Number.NaN;
}

const until = (cond: () => Promise<boolean> | boolean, ms = 5000) => waitUntil(cond, ms, "condition", 25);

test("client abort mid-stream cancels the engine request", async () => {
  const ac = new AbortController();
  const up = await nexec.send(
    worker,
    "chat",
    { model: MODEL, messages: [{ role: "user", content: "long" }], max_tokens: 3000, stream: true },
    { signal: ac.signal },
  );
  const it = up.body[Symbol.asyncIterator]();
  await it.next();
  await until(async () => (await running()) === 1);
  ac.abort();
  await assert.rejects(it.next(), { name: "AbortError" });
  await until(async () => (await running()) === 0, 3000);
  await until(() => agent.active === 0);
});

test("abort before the head (non-streamed) cancels the engine request too", async () => {
  const ac = new AbortController();
  const p = nexec.send(
    worker,
    "completion",
    { model: MODEL, prompt: "long one", max_tokens: 3000 },
    { signal: ac.signal },
  );
  await until(async () => (await running()) === 1);
  ac.abort();
  await assert.rejects(p, { name: "AbortError" });
  await until(async () => (await running()) === 0, 3000);
});

test("a consumer that falls behind stops the agent at the credit window", async () => {
  // An engine that writes 500 small SSE events as fast as it can, one write each.
  const engine = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    let i = 0;
    const pump = () => {
      while (i < 500) {
        const ok = res.write(`data: {"i":${i++}}\n\n`);
        if (i % 10 === 0 || !ok) {
          setImmediate(pump);
          return;
        }
      }
      res.end("data: [DONE]\n\n");
    };
    pump();
  });
  await new Promise<void>((r) => engine.listen(0, "127.0.0.1", () => r()));
  const port = (engine.address() as AddressInfo).port;
  const fast = await startRequestAgent({
    nc: ncAgent,
    engineUrl: `http://127.0.0.1:${port}`,
    model: MODEL,
    workerId: "fast",
  });
  const small = new NatsRequestExecutor({ nc: ncClient, window: 8, pingMs: 200 });
  try {
    const w = state({ id: "fast", url: `http://127.0.0.1:${port}`, natsSubject: fast.subject });
    const up = await small.send(w, "chat", { stream: true }, { signal: signal() });
    const it = up.body[Symbol.asyncIterator]();
    let text = Buffer.from((await it.next()).value as Uint8Array).toString();
    // Hold off reading while the engine keeps producing: the agent must stop at the window.
    await new Promise((r) => setTimeout(r, 500));
    const st = fast.streamStats();
    assert.equal(st.length, 1);
    assert.ok(st[0].allowed <= 1 + 8, `allowed ${st[0].allowed}`);
    assert.equal(st[0].sent, st[0].allowed, `stalled at the window: ${JSON.stringify(st)}`);
    for (let r = await it.next(); !r.done; r = await it.next()) text += Buffer.from(r.value).toString();
    const got = text.split("\n\n").filter((e) => e.startsWith("data: "));
    assert.equal(got.length, 501);
    assert.equal(got[499], 'data: {"i":499}');
    assert.equal(got[500], "data: [DONE]");
  } finally {
    small.close();
    await fast.close();
    engine.close();
  }
});

test("an answer that ends while its last chunk waits for credit: the chunk, then the end", async () => {
  // A Content-Length answer in three writes apart in time (three socket reads at the agent):
  // with a window of 1 and a client not reading yet, the second read finds no credit and
  // waits; the third completes the answer meanwhile, so the end frame must wait behind both
  // (agent-stream.ts).
  const parts = ['{"part":1,', '"pad":"', `${"x".repeat(2000)}"}`];
  const total = parts.join("");
  const engine = createServer((_req, res) => {
    res.writeHead(200, {
      "content-type": "application/json",
      "content-length": String(Buffer.byteLength(total)),
    });
    res.write(parts[0]);
    setTimeout(() => res.write(parts[1]), 30);
    setTimeout(() => res.end(parts[2]), 60);
  });
  await new Promise<void>((r) => engine.listen(0, "127.0.0.1", () => r()));
  const port = (engine.address() as AddressInfo).port;
  const a = await startRequestAgent({
    nc: ncAgent,
    engineUrl: `http://127.0.0.1:${port}`,
    model: MODEL,
    workerId: "w-credit",
  });
  const one = new NatsRequestExecutor({ nc: ncClient, window: 1, pingMs: 200 });
  try {
    const w = state({ id: "w-credit", url: `http://127.0.0.1:${port}`, natsSubject: a.subject });
    // stream: true, or the client would read the answer whole at once (client.ts, bufferWhole).
    const up = await one.send(w, "completion", { prompt: "x", stream: true }, { signal: signal() });
    const it = up.body[Symbol.asyncIterator]();
    let text = "";
    // Not reading: the engine's answer completes meanwhile, its tail held at the agent.
    await new Promise((r) => setTimeout(r, 300));
    const st = a.streamStats();
    assert.equal(st.length, 1, "the stream is still open at the agent");
    assert.deepEqual(st, [{ sent: 1, allowed: 1 }], "held at the window");
    for (let r = await it.next(); !r.done; r = await it.next()) text += Buffer.from(r.value).toString();
    assert.equal(text, total);
    await waitUntil(() => a.active === 0, 2000, "the agent's stream closed");
  } finally {
    one.close();
    await a.close();
    engine.close();
  }
});

test("no agent on the subject → WorkerUnreachableError (connect), the router's retry path", async () => {
  const ghost = state({ id: "ghost", url: "http://127.0.0.1:9" });
  const t0 = Date.now();
  await assert.rejects(nexec.send(ghost, "chat", { model: MODEL }, { signal: signal() }), (e: unknown) => {
    assert.ok(e instanceof WorkerUnreachableError);
    assert.equal(e.kind, "connect");
    return true;
  });
  assert.ok(Date.now() - t0 < 1000);
});

test("an agent that stops answering times out into WorkerUnreachableError", async () => {
  // Something holds the subject but never answers (a hung agent).
  const subj = requestSubject(MODEL, "hung");
  const hung = ncAgent.subscribe(subj, { callback: () => {} });
  const hungCtl = ncAgent.subscribe(`${subj}.ctl`, { callback: () => {} });
  await ncAgent.flush();
  try {
    const t0 = Date.now();
    await assert.rejects(
      nexec.send(state({ id: "hung", url: "http://h" }), "chat", { model: MODEL }, { signal: signal() }),
      (e: unknown) => e instanceof WorkerUnreachableError && e.kind === "connect",
    );
    const took = Date.now() - t0;
    assert.ok(took >= 400 && took < 2500, `took ${took} ms`);
  } finally {
    hung.unsubscribe();
    hungCtl.unsubscribe();
  }
});

test("an agent whose engine is down answers WorkerUnreachableError", async () => {
  const dead = await startRequestAgent({
    nc: ncAgent,
    engineUrl: "http://127.0.0.1:9",
    model: MODEL,
    workerId: "dead-engine",
  });
  try {
    await assert.rejects(
      nexec.send(
        state({ id: "dead-engine", url: "http://127.0.0.1:9" }),
        "chat",
        { model: MODEL },
        { signal: signal() },
      ),
      (e: unknown) => e instanceof WorkerUnreachableError && e.kind === "connect",
    );
  } finally {
    await dead.close();
  }
});

test("NATS restarted mid-run: clients reconnect and later requests succeed", async () => {
  const body = { model: MODEL, prompt: "before and after", max_tokens: 8, seed: 1 };
  const before = (await (await nexec.send(worker, "completion", body, { signal: signal() })).json()) as {
    choices: unknown;
  };
  // A stream in flight while the broker goes away fails (retry is the router's call).
  const inflight = await nexec.send(
    worker,
    "chat",
    { model: MODEL, messages: [{ role: "user", content: "x" }], max_tokens: 3000, stream: true },
    { signal: signal() },
  );
  const failed = readAll(inflight).then(
    () => false,
    () => true,
  );
  await nats.restart();
  assert.equal(await failed, true, "the in-flight stream failed instead of hanging");
  // Reconnect takes a moment; the first request after it must succeed without retries of ours.
  await until(() => !ncClient.isClosed() && ncClient.info !== undefined && ncAgent.info !== undefined);
  let after: { choices: unknown } | undefined;
  const end = Date.now() + 10_000;
  while (!after) {
    try {
      after = (await (await nexec.send(worker, "completion", body, { signal: signal() })).json()) as {
        choices: unknown;
      };
    } catch (e) {
      if (!(e instanceof WorkerUnreachableError) || Date.now() > end) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  assert.deepEqual(after.choices, before.choices);
  // The engine request of the stream cut off by the restart does not linger.
  await until(async () => (await running()) === 0, 8000);
});

test("a body over the broker's max_payload is a 413, not a worker failure; junk header names are dropped", async () => {
  const big = { model: MODEL, prompt: "x".repeat(1_100_000), max_tokens: 1 };
  await assert.rejects(nexec.send(worker, "completion", big, { signal: signal() }), (e: unknown) => {
    assert.ok(!(e instanceof WorkerUnreachableError));
    assert.equal((e as { status?: number }).status, 413);
    return true;
  });
  const up = await nexec.send(
    worker,
    "completion",
    { model: MODEL, prompt: "ok", max_tokens: 2 },
    { signal: signal(), headers: { "bad header:name": "v", "x-request-id": "fine" } },
  );
  assert.equal(up.status, 200);
  await up.json();
});
