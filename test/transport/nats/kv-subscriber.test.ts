/**
 * Forged KV batches on the NATS event plane (issue #30 item 1): a batch captured on one
 * worker's subject and republished on another's as "seq 0" used to reset that worker's index
 * ("engine sequence restarted") and credit it with the other worker's blocks. Batches now carry
 * the relay's epoch (header Infera-Kv-Epoch), the record announces it (`natsKvEpoch`), and a
 * restart counts only when a new record announces a new epoch. Real nats-server, real relays.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { headers, type Msg, type NatsConnection } from "@nats-io/transport-node";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { NatsKvIngest } from "../../../src/transport/nats/kv-ingest.ts";
import { startKvRelay } from "../../../src/transport/nats/kv-relay.ts";
import { encodeKvMessage, KV_EPOCH_HEADER, seqFrame } from "../../../src/transport/nats/kv-wire.ts";
import { kvSubject } from "../../../src/transport/nats/subjects.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { waitUntil } from "../../helpers/wait.ts";
import { FakeKvEngine } from "./fake-kv-engine.ts";

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

const until = (cond: () => boolean, ms = 5000) => waitUntil(cond, ms, "condition", 10);

async function worker(id: string) {
  const eng = new FakeKvEngine();
  await eng.start();
  cleanups.push(() => eng.close());
  const events = {
    endpoint: eng.endpoint,
    replayEndpoint: eng.replayEndpoint,
    topic: "",
    framing: "seq" as const,
  };
  const relay = await startKvRelay({ nc, model: "m", workerId: id, events });
  cleanups.push(() => relay.close());
  await eng.subscribed(); // ZMQ slow joiner: the relay's subscription is at the PUB
  const record = (epoch: string): WorkerRecord => ({
    id,
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm",
    role: "mixed",
    url: "http://127.0.0.1:1",
    connector: { kind: "none" },
    blockSize: 4,
    kvEvents: events,
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
    natsKvEpoch: epoch,
  });
  return { eng, relay, record };
}

/** `n` one-block batches chained from hash `base`. */
async function storeBlocks(eng: FakeKvEngine, base: number, n: number): Promise<void> {
  for (let i = 0; i < n; i++)
    await eng.publish(FakeKvEngine.batch(base + i, i === 0 ? null : base + i - 1, [base + i, 0, 0, 0]));
}

async function refused(ingest: NatsKvIngest, worker: string): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const v of (await ingest.metrics.refused.get()).values)
    if (v.labels.worker === worker) out[String(v.labels.reason)] = v.value;
  return out;
}

test("a batch replayed from another worker, or a bare seq-0 restart, is refused and counted; an announced new epoch resets", async () => {
  const a = await worker("a");
  const b = await worker("b");
  const disc = new MemoryDiscovery();
  const ingest = new NatsKvIngest({ nc, watcher: disc, replayTimeoutMs: 1000 });
  cleanups.push(() => ingest.close());
  ingest.start();
  disc.put(a.record(a.relay.epoch));
  disc.put(b.record(b.relay.epoch));
  await ingest.synced();

  // The attacker listens on A's subject and keeps A's first batch (seq 0) with its header.
  let captured: Msg | undefined;
  const spy = nc.subscribe(kvSubject("m", "a"), {
    callback: (_e, m) => {
      captured ??= m;
    },
  });
  cleanups.push(() => spy.unsubscribe());
  await nc.flush();
  await storeBlocks(a.eng, 100, 2);
  await storeBlocks(b.eng, 200, 10);
  const index = ingest.index;
  await until(() => index.blockCount("a", 0) === 2 && index.blockCount("b", 0) === 10);
  assert.ok(captured);

  // 1. A's seq-0 batch, with A's epoch header, republished on B's subject (the attack:
  // before, B was reset to A's blocks).
  nc.publish(kvSubject("m", "b"), captured.data, { headers: captured.headers });
  // 2. The same without any header.
  nc.publish(kvSubject("m", "b"), captured.data);
  // 3. A forger that copied B's epoch: a bare restart on a running feed is still refused.
  const h = headers();
  h.set(KV_EPOCH_HEADER, b.relay.epoch);
  nc.publish(kvSubject("m", "b"), encodeKvMessage(seqFrame(0), FakeKvEngine.batch(999, null, [9, 9, 9, 9])), {
    headers: h,
  });
  await nc.flush();
  const sub = ingest.subscriber("b")!;
  await until(() => sub.stats.refused === 3);
  assert.deepEqual(await refused(ingest, "b"), { epoch: 2, restart: 1 });
  assert.equal(index.blockCount("b", 0), 10, "B's index untouched");
  assert.equal(sub.stats.resets, 0);

  // B's legitimate batches keep flowing.
  await storeBlocks(b.eng, 300, 1);
  await until(() => index.blockCount("b", 0) === 11);

  // A genuine restart: a new relay (new epoch) that a new record announces. B is rebuilt
  // from the new epoch's batches only.
  const b2 = await worker("b");
  assert.notEqual(b2.relay.epoch, b.relay.epoch);
  await storeBlocks(b2.eng, 400, 3);
  disc.put(b2.record(b2.relay.epoch));
  await until(() => ingest.subscriber("b") !== sub);
  await ingest.synced();
  await until(() => index.blockCount("b", 0) === 3);
  // The old relay's stream is now the wrong epoch (its answers to the new feed's start-up
  // replay were refused too: both relays serve B's replay subject).
  const sub2 = ingest.subscriber("b")!;
  const before = sub2.stats.refused;
  await storeBlocks(b.eng, 500, 1);
  await until(() => sub2.stats.refused === before + 1);
  assert.equal(index.blockCount("b", 0), 3);
});

test("an engine restarting under its relay starts a new epoch and announces it", async () => {
  const w = await worker("r");
  const seen: string[] = [];
  const relay = await startKvRelay({
    nc,
    model: "m",
    workerId: "r2",
    events: { endpoint: w.eng.endpoint, replayEndpoint: w.eng.replayEndpoint, topic: "", framing: "seq" },
    onEpochChange: (e) => seen.push(e),
  });
  cleanups.push(() => relay.close());
  await w.eng.subscribed(2); // the second relay's subscription too
  const first = relay.epoch;
  await storeBlocks(w.eng, 1, 3);
  await until(() => relay.nextSeq === 3);
  // The engine's sequence starts again from 0 (vLLM numbers batches from 0 per publisher:
  // vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34,
  // ZmqEventPublisher._seq starts at 0).
  (w.eng as unknown as { seq: number }).seq = 0;
  await storeBlocks(w.eng, 50, 1);
  await until(() => seen.length === 1);
  assert.notEqual(relay.epoch, first);
  assert.deepEqual(seen, [relay.epoch]);
});
