import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { Packr } from "msgpackr";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { decodeMessage, isDecodeError } from "../../../src/kv/events.ts";
import type { KvBatchSink } from "../../../src/kv/feeds/types.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { NatsKvIngest } from "../../../src/transport/nats/kv-ingest.ts";
import { type NatsKvRelay, startKvRelay } from "../../../src/transport/nats/kv-relay.ts";
import { startKvSubscriber } from "../../../src/transport/nats/kv-subscriber.ts";
import { kvRankSubject, readKvSeq } from "../../../src/transport/nats/kv-wire.ts";
import { kvReplaySubject, kvSubject } from "../../../src/transport/nats/subjects.ts";
import { storedWire } from "../../helpers/kv-events.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { waitUntil } from "../../helpers/wait.ts";
import { FakeKvEngine, seqBuf } from "./fake-kv-engine.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

let nats: NatsServerHandle;
let nc: NatsConnection;
const cleanups: (() => unknown)[] = [];

before(async () => {
  nats = await startNats();
  nc = await connectNats({ url: nats.url });
});
after(async () => {
  for (const c of cleanups.reverse()) await c();
  await nc.close();
  await nats.close();
});

class Collect implements KvBatchSink {
  seqs: number[] = [];
  payloads = new Map<number, Buffer>();
  resets: string[] = [];
  onBatch(seq: number, payload: Uint8Array): void {
    this.seqs.push(seq);
    this.payloads.set(seq, Buffer.from(payload));
  }
  onReset(reason: string): void {
    this.resets.push(reason);
  }
}

const until = (cond: () => boolean, ms = 5000) => waitUntil(cond, ms, "condition", 10);

async function engineWithRelay(name: string, bufferBatches?: number) {
  const eng = new FakeKvEngine();
  await eng.start();
  cleanups.push(() => eng.close());
  const relay = await startKvRelay({
    nc,
    model: "m",
    workerId: name,
    bufferBatches,
    events: { endpoint: eng.endpoint, replayEndpoint: eng.replayEndpoint, topic: "", framing: "seq" },
  });
  cleanups.push(() => relay.close());
  // ZMQ slow joiner: wait until the SUB's subscription is at the PUB before publishing for real.
  await eng.subscribed();
  return { eng, relay };
}

/**
 * A lossy hop between the relay and a subscriber on `subject`: forwards the live messages
 * `pass` lets through, and passes replay requests through to the agent.
 */
async function lossyHop(relay: NatsKvRelay, subject: string, pass: (data: Uint8Array) => boolean) {
  const fwd = nc.subscribe(relay.subject, {
    callback: (_e, msg) => {
      if (pass(msg.data)) nc.publish(subject, msg.data);
    },
  });
  const fwdReplay = nc.subscribe(kvReplaySubject(subject), {
    callback: (_e, msg) => nc.publish(relay.replaySubject, msg.data, { reply: msg.reply }),
  });
  cleanups.push(() => {
    fwd.unsubscribe();
    fwdReplay.unsubscribe();
  });
  await nc.flush();
}

test("relayed batches are byte-identical with seq intact; ZMQ drops are recovered from the engine's replay", async () => {
  const { eng, relay } = await engineWithRelay("w-bytes");
  const sink = new Collect();
  const sub = await startKvSubscriber({ nc, subject: relay.subject, sink });
  cleanups.push(() => sub.close());
  for (let i = 0; i < 30; i++) {
    await eng.publish(FakeKvEngine.batch(1000 + i, i === 0 ? null : 999 + i, [i, i + 1, i + 2, i + 3]), {
      drop: i === 5 || i === 6 || i === 17,
    });
  }
  await until(() => sink.seqs.length >= 30);
  assert.deepEqual(
    sink.seqs,
    Array.from({ length: 30 }, (_, i) => i),
  );
  for (const b of eng.sent) assert.deepEqual(sink.payloads.get(b.seq), b.payload, `seq ${b.seq}`);
  assert.equal(relay.stats.recovered, 3);
  assert.equal(relay.stats.lost, 0);
  assert.deepEqual(sink.resets, []);
  // The relayed payload decodes exactly as the ZMQ frames would.
  const m = decodeMessage([Buffer.from("kv"), seqBuf(3), sink.payloads.get(3)!], "seq");
  assert.ok(!isDecodeError(m));
  assert.deepEqual(m.batch.events[0].type, "BlockStored");
});

test("a late subscriber replays the agent's history; a gap between agent and server is recovered", async () => {
  const { eng, relay } = await engineWithRelay("w-gap");
  for (let i = 0; i < 20; i++) await eng.publish(FakeKvEngine.batch(i, null, [i]));
  await until(() => relay.nextSeq === 20);
  // A lossy hop between the relay and the subscriber loses some live messages.
  const lossySubject = "test.lossy.kv";
  const drop = new Set([22, 23, 27]);
  await lossyHop(relay, lossySubject, (data) => !drop.has(readKvSeq(data)!));
  const sink = new Collect();
  const sub = await startKvSubscriber({ nc, subject: lossySubject, sink });
  cleanups.push(() => sub.close());
  assert.deepEqual(
    sink.seqs,
    Array.from({ length: 20 }, (_, i) => i),
    "history replayed on start",
  );
  for (let i = 20; i < 35; i++) await eng.publish(FakeKvEngine.batch(i, null, [i]));
  await until(() => sink.seqs.length >= 35);
  assert.deepEqual(
    sink.seqs,
    Array.from({ length: 35 }, (_, i) => i),
  );
  assert.ok(sub.stats.gaps >= 1, `gaps seen: ${sub.stats.gaps}`);
  assert.ok(sub.stats.replayed >= 23, `replayed: ${sub.stats.replayed}`);
  assert.deepEqual(sink.resets, []);
  for (const b of eng.sent) assert.deepEqual(sink.payloads.get(b.seq), b.payload);
});

test("history the agent no longer holds resets the worker, then delivery continues", async () => {
  const { eng, relay } = await engineWithRelay("w-reset", 4);
  const lossySubject = "test.lossy2.kv";
  let dropping = false;
  let dropped = 0;
  await lossyHop(relay, lossySubject, () => {
    if (dropping) dropped++;
    return !dropping;
  });
  const sink = new Collect();
  const sub = await startKvSubscriber({ nc, subject: lossySubject, sink });
  cleanups.push(() => sub.close());
  for (let i = 0; i < 3; i++) await eng.publish(FakeKvEngine.batch(i, null, [i]));
  await until(() => sink.seqs.length === 3);
  dropping = true;
  for (let i = 3; i < 12; i++) await eng.publish(FakeKvEngine.batch(i, null, [i]));
  await until(() => relay.nextSeq === 12);
  // The hop sees a batch after the relay has published it: wait until all 9 were dropped.
  await until(() => dropped === 9);
  dropping = false;
  await eng.publish(FakeKvEngine.batch(12, null, [12]));
  await until(() => sink.seqs.includes(12));
  assert.equal(sink.resets.length, 1, "one reset for the lost history");
  // After the reset it continues from the oldest the agent still had (ring of 4: 9..12).
  assert.deepEqual(sink.seqs, [0, 1, 2, 9, 10, 11, 12]);
});

test("a broker restart mid-run: the subscriber catches up from the agent's buffer, in order, no reset", async () => {
  const { eng, relay } = await engineWithRelay("w-restart");
  const sink = new Collect();
  const sub = await startKvSubscriber({ nc, subject: relay.subject, sink });
  cleanups.push(() => sub.close());
  for (let i = 0; i < 5; i++) await eng.publish(FakeKvEngine.batch(i, null, [i]));
  await until(() => sink.seqs.length === 5);
  await nats.restart();
  // Batches published while the broker is away or the subscription is not yet back.
  for (let i = 5; i < 10; i++) await eng.publish(FakeKvEngine.batch(i, null, [i]));
  await until(() => relay.nextSeq === 10);
  // Once both ends are back, the next batch reveals any gap and replay fills it.
  const end = Date.now() + 10_000;
  let i = 10;
  while (sink.seqs.length < i && Date.now() < end) {
    await eng.publish(FakeKvEngine.batch(i, null, [i]));
    i++;
    await new Promise((r) => setTimeout(r, 200));
  }
  await until(() => sink.seqs.length === i);
  assert.deepEqual(
    sink.seqs,
    Array.from({ length: i }, (_, k) => k),
  );
  assert.deepEqual(sink.resets, []);
});

test("a DP engine: the relay follows every rank's sockets, each on its own subject, and the index keeps ranks apart", async () => {
  // vLLM/SGLang bind rank r's PUB and replay sockets on port + r, each rank numbering its
  // batches from 0 (vllm-project/vllm vllm/distributed/kv_events.py @
  // 0181ea3173e53eea8cf04a86891488e3dc89bb34, ZmqEventPublisher.offset_endpoint_port).
  const packr = new Packr({ useRecords: false });
  const engines = [new FakeKvEngine(), new FakeKvEngine()];
  for (const e of engines) {
    await e.start();
    cleanups.push(() => e.close());
  }
  const ranks = engines.map((e, r) => ({
    dpRank: r,
    endpoint: e.endpoint,
    replayEndpoint: e.replayEndpoint,
  }));
  const events = {
    endpoint: ranks[0].endpoint,
    replayEndpoint: ranks[0].replayEndpoint,
    topic: "",
    framing: "seq" as const,
    ranks,
  };
  const relay = await startKvRelay({ nc, model: "m", workerId: "dp", events });
  cleanups.push(() => relay.close());
  assert.equal(relay.subject, kvSubject("m", "dp"));
  assert.deepEqual(
    relay.siblings.map((r) => r.subject),
    [kvRankSubject(kvSubject("m", "dp"), 1)],
  );

  const disc = new MemoryDiscovery();
  const ingest = new NatsKvIngest({ nc, watcher: disc, replayTimeoutMs: 1000 });
  cleanups.push(() => ingest.close());
  ingest.start();
  disc.put({
    id: "dp",
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm",
    role: "mixed",
    url: "http://127.0.0.1:1",
    connector: { kind: "none" },
    blockSize: 4,
    kvEvents: events,
    dpSize: 2,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
  });
  await ingest.synced();
  await Promise.all(engines.map((e) => e.subscribed())); // ZMQ slow joiner on both relays
  const toks = [1, 2, 3, 4, 5, 6, 7, 8];
  const stored = storedWire([11, 12], null, toks, 4);
  await engines[0].publish(packr.pack([1, [stored], 0]));
  await engines[1].publish(packr.pack([1, [stored], 1]));
  const index = ingest.index;
  await until(() => index.blockCount("dp", 0) === 2 && index.blockCount("dp", 1) === 2);
  assert.equal(ingest.subscribers("dp").length, 2);
  // Rank 1 evicts its blocks; rank 0 still holds them (before: one subject, rank 1 never relayed).
  await engines[1].publish(packr.pack([2, [["BlockRemoved", [11, 12], "GPU", 0]], 1]));
  await until(() => index.blockCount("dp", 1) === 0);
  const best = new Int32Array(1);
  assert.deepEqual([...index.overlaps(toks, ["dp"], null, null, best)], [2]);
  assert.equal(best[0], 0);
});
