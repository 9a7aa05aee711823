import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { KvIngest } from "../../../src/kv/feeds/zmq-ingest.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { ServerRoutingRequest } from "../../../src/server/routing-request.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { NatsKvIngest } from "../../../src/transport/nats/kv-ingest.ts";
import { type NatsKvRelay, startKvRelay } from "../../../src/transport/nats/kv-relay.ts";
import { createLogger } from "../../../src/util/log.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { type SimProcess, simWorkerRecord, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";
import { presetScheduler } from "../../router/pipeline/preset.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
const MODEL = "kv-model";
const logger = createLogger("test");

let nats: NatsServerHandle;
let nc: NatsConnection;
const sims: SimProcess[] = [];
const relays: NatsKvRelay[] = [];
const discovery = new MemoryDiscovery();
let zmqIngest: KvIngest;
let natsIngest: NatsKvIngest;

function record(id: string, sim: SimProcess): WorkerRecord {
  return simWorkerRecord(sim, { id, model: MODEL, maxModelLen: 8192 });
}

before(async () => {
  nats = await startNats();
  nc = await connectNats({ url: nats.url });
  for (const id of ["w-a", "w-b"]) {
    const sim = await startSim({ model: MODEL, args: ["--speed", "50"] });
    sims.push(sim);
    const rec = record(id, sim);
    relays.push(await startKvRelay({ nc, model: MODEL, workerId: id, events: rec.kvEvents! }));
    discovery.put(rec);
  }
  await discovery.start();
  zmqIngest = new KvIngest({ watcher: discovery, logger });
  natsIngest = new NatsKvIngest({ nc, watcher: discovery, logger });
  zmqIngest.start();
  natsIngest.start();
  await Promise.all([zmqIngest.synced(), natsIngest.synced()]);
  // ZMQ subscribers join late (slow joiner): let the SUB sockets connect before traffic.
  await new Promise((r) => setTimeout(r, 300));
});

after(async () => {
  await zmqIngest.close();
  await natsIngest.close();
  for (const r of relays) await r.close();
  await nc.close();
  for (const s of sims) await s.stop();
  await nats.close();
});

const DOCS = [
  "Alpha document. ".repeat(40),
  "Bravo manual about NATS subjects and inboxes. ".repeat(20),
  "Charlie notes on ZMQ sequence numbers and replay. ".repeat(20),
];

async function complete(sim: SimProcess, prompt: string): Promise<void> {
  const r = await fetch(`${sim.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: 4, seed: 1 }),
  });
  assert.equal(r.status, 200);
  await r.arrayBuffer();
}

function states(): WorkerState[] {
  return discovery
    .workers()
    .map((record) => ({ record, inFlight: 0, pendingPrefillTokens: 0, available: true }));
}

const until = (cond: () => boolean, ms = 8000) => waitUntil(cond, ms, "condition", 25);

test("kv-aware picks the same worker whether events come over ZMQ or the NATS relay", async () => {
  // Doc 0 is cached on w-a, doc 1 on w-b, doc 2 on both (w-b twice: nothing changes the cache).
  await complete(sims[0], `${DOCS[0]}question one`);
  await complete(sims[1], `${DOCS[1]}question one`);
  await complete(sims[0], `${DOCS[2]}question one`);
  await complete(sims[1], `${DOCS[2]}question two`);
  const ids = ["w-a", "w-b"];
  await until(() =>
    ids.every((id) => {
      const n = zmqIngest.index.blockCount(id);
      return n > 0 && n === natsIngest.index.blockCount(id);
    }),
  );
  // Settle: both planes must stay equal once traffic stops.
  await new Promise((r) => setTimeout(r, 200));
  for (const id of ids) assert.equal(natsIngest.index.blockCount(id), zmqIngest.index.blockCount(id), id);

  const tok = getDefaultTokenizer();
  const viaZmq = presetScheduler("kv-aware", { logger, kvIndex: zmqIngest.index });
  const viaNats = presetScheduler("kv-aware", { logger, kvIndex: natsIngest.index });
  const cands = states();
  const picks: string[] = [];
  for (const [i, doc] of DOCS.entries()) {
    const body = { model: MODEL, prompt: `${doc}a new question ${i}` };
    const req = new ServerRoutingRequest(`r${i}`, MODEL, "completion", body, false, undefined, tok);
    const a = viaZmq.explain(req, cands);
    const b = viaNats.explain(req, cands);
    assert.deepEqual(b.overlaps, a.overlaps, `overlaps for doc ${i}`);
    assert.deepEqual(b.costs, a.costs, `costs for doc ${i}`);
    const pa = viaZmq.select(req, cands).worker.record.id;
    const pb = viaNats.select(req, cands).worker.record.id;
    assert.equal(pb, pa, `choice for doc ${i}`);
    picks.push(pb);
    assert.ok(Math.max(...a.overlaps) > 0, `doc ${i} has cached blocks somewhere`);
  }
  // The choice follows the cache: doc 0 → w-a, doc 1 → w-b.
  assert.equal(picks[0], "w-a");
  assert.equal(picks[1], "w-b");
  for (const r of relays) assert.equal(r.stats.lost, 0);
});
