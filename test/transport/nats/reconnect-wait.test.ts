/**
 * The NATS request executor across a lost broker connection: a request without a response head
 * is not failed because the broker went away; it waits for the reconnect (bounded by
 * `reconnectWaitMs`) and is sent then, or sent again when the disconnect caught it in flight.
 *
 * Why waiting, not publishing: nats.js (@nats-io/nats-core 3.x lib/protocol.js) resets its
 * outbound buffer in prepare() at every dial attempt, so a publish made while disconnected is
 * dropped; the "reconnect" status comes after the re-dial has re-sent the subscriptions.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { Command } from "commander";
import { flagsToConfig, registerServer } from "../../../src/cli/server.ts";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { configFromEnv, mergeConfig } from "../../../src/server/config.ts";
import { type NatsRequestAgent, startRequestAgent } from "../../../src/transport/nats/agent.ts";
import { addNatsOptions } from "../../../src/transport/nats/cli-options.ts";
import { NatsRequestExecutor } from "../../../src/transport/nats/client.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
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
let worker: WorkerState;

before(async () => {
  nats = await startNats();
  sim = await startSim({ model: MODEL, args: ["--speed", "5"] });
  ncAgent = await connectNats({ url: nats.url, name: "agent" });
  ncClient = await connectNats({ url: nats.url, name: "server" });
  agent = await startRequestAgent({ nc: ncAgent, engineUrl: sim.url, model: MODEL, workerId: "w1" });
  nexec = new NatsRequestExecutor({ nc: ncClient, pingMs: 200, acceptTimeoutMs: 500, reconnectWaitMs: 8000 });
  const record: WorkerRecord = mixedRecord({
    model: MODEL,
    id: "w1",
    url: sim.url,
    natsSubject: agent.subject,
  });
  worker = { record, inFlight: 0, pendingPrefillTokens: 0, available: true };
});

after(async () => {
  nexec.close();
  await agent.close();
  await ncAgent.close();
  await ncClient.close();
  await sim.stop();
  await nats.close();
});

const signal = () => new AbortController().signal;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = (cond: () => Promise<boolean> | boolean, ms = 8000) => waitUntil(cond, ms, "condition", 25);
const running = async () => parseMetric(await sim.metrics(), "vllm:num_requests_running") ?? Number.NaN;
const body = { model: MODEL, prompt: "across the restart", max_tokens: 8, seed: 3 };
type Completion = { choices: { text: string; finish_reason: string }[] };

async function bothUp(): Promise<void> {
  await until(() => !nexec.isDown && ncAgent.info !== undefined && !ncAgent.isClosed());
  // The agent's subscription is back once a request goes through.
  await until(async () => {
    try {
      await (await nexec.send(worker, "completion", body, { signal: signal() })).json();
      return true;
    } catch {
      return false;
    }
  });
}

test("a request sent while the broker is down waits for the reconnect and is served", async () => {
  const expected = (await (
    await nexec.send(worker, "completion", body, { signal: signal() })
  ).json()) as Completion;
  await nats.stop();
  await until(() => nexec.isDown, 5000);
  const t0 = Date.now();
  const pending = nexec.send(worker, "completion", body, { signal: signal() });
  await sleep(400);
  await nats.restart();
  const got = (await (await pending).json()) as Completion;
  assert.ok(Date.now() - t0 >= 400, "it waited for the broker");
  assert.deepEqual(got.choices, expected.choices);
  await bothUp();
});

test("a request without a head when the broker restarts is sent again; the first engine request is stopped", async () => {
  await bothUp();
  const long = { model: MODEL, prompt: "long, not streamed", max_tokens: 600, seed: 5 };
  const pending = nexec.send(worker, "completion", long, { signal: signal() });
  await until(async () => (await running()) >= 1, 5000);
  await nats.restart();
  const res = await pending;
  assert.equal(res.status, 200);
  const got = (await res.json()) as Completion;
  assert.equal(got.choices.length, 1);
  assert.ok(got.choices[0]!.text.length > 0);
  // The engine request the restart cut off was aborted (not left to run to its end).
  await until(async () => (await running()) === 0, 10_000);
});

test("right after a reconnect, 'no responders' is retried until the agent has subscribed again", async () => {
  await bothUp();
  await agent.close();
  await nats.restart();
  await until(() => !nexec.isDown, 5000);
  const pending = nexec.send(worker, "completion", body, { signal: signal() });
  await sleep(300);
  agent = await startRequestAgent({ nc: ncAgent, engineUrl: sim.url, model: MODEL, workerId: "w1" });
  assert.equal(agent.subject, worker.record.natsSubject);
  const got = (await (await pending).json()) as Completion;
  assert.equal(got.choices.length, 1);
});

test("the wait is bounded by reconnectWaitMs, 0 fails at once, and an abort ends it", async () => {
  await bothUp();
  // 1,500 ms against 0: far enough apart that a loaded box (a 200 ms stall) cannot blur them.
  const short = new NatsRequestExecutor({ nc: ncClient, reconnectWaitMs: 1500 });
  const none = new NatsRequestExecutor({ nc: ncClient, reconnectWaitMs: 0 });
  try {
    await nats.stop();
    await until(() => short.isDown && none.isDown && nexec.isDown, 5000);
    let t0 = Date.now();
    await assert.rejects(
      short.send(worker, "completion", body, { signal: signal() }),
      (e: unknown) => e instanceof WorkerUnreachableError && e.kind === "connect",
    );
    const waited = Date.now() - t0;
    assert.ok(waited >= 1480 && waited < 6000, `waited ${waited} ms`);
    t0 = Date.now();
    await assert.rejects(
      none.send(worker, "completion", body, { signal: signal() }),
      (e: unknown) => e instanceof WorkerUnreachableError,
    );
    const none0 = Date.now() - t0;
    assert.ok(none0 < 750, `reconnectWaitMs 0 failed after ${none0} ms, not at once`);
    const ac = new AbortController();
    const aborted = nexec.send(worker, "completion", body, { signal: ac.signal });
    setTimeout(() => ac.abort(), 100);
    t0 = Date.now();
    await assert.rejects(aborted, (e: unknown) => (e as Error).name === "AbortError");
    assert.ok(Date.now() - t0 < 1000);
    // A head limit shorter than the wait ends it as a timeout.
    await assert.rejects(
      nexec.send(worker, "completion", body, { signal: signal(), timeoutMs: 200 }),
      (e: unknown) => (e as { status?: number }).status === 504,
    );
  } finally {
    short.close();
    none.close();
    await nats.restart();
  }
  await bothUp();
});

test("--nats-reconnect-wait-ms / INFERA_NATS_RECONNECT_WAIT_MS reach the server's NATS settings", async () => {
  const program = new Command().exitOverride();
  registerServer(program);
  const server = program.commands.find((c) => c.name() === "server")!;
  server.action(() => {});
  await program.parseAsync(["server", "--nats-url", "nats://h:1", "--nats-reconnect-wait-ms", "2500"], {
    from: "user",
  });
  const fromFlags = mergeConfig(flagsToConfig(server.opts()));
  assert.equal(fromFlags.nats?.reconnectWaitMs, 2500);
  const fromEnv = mergeConfig(
    configFromEnv({ INFERA_NATS_URL: "nats://h:1", INFERA_NATS_RECONNECT_WAIT_MS: "0" }),
  );
  assert.equal(fromEnv.nats?.reconnectWaitMs, 0);
  assert.throws(() =>
    configFromEnv({ INFERA_NATS_URL: "nats://h:1", INFERA_NATS_RECONNECT_WAIT_MS: "soon" }),
  );
  // The engine's NATS flags do not take it (it only concerns the server's requests).
  const eng = addNatsOptions(new Command("engine"));
  assert.ok(!eng.options.some((o) => o.long === "--nats-reconnect-wait-ms"));
});
