import assert from "node:assert/strict";
import { after, test } from "node:test";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { KvIngest } from "../../../src/kv/feeds/zmq-ingest.ts";
import { KvIndex } from "../../../src/kv/index.ts";
import { createLogger } from "../../../src/util/log.ts";
import { removedWire, storedWire } from "../../helpers/kv-events.ts";
import { FakePublisher, waitFor } from "../fake-publisher.ts";

const BS = 4;
const logger = createLogger("test", {});
logger.level = "silent";
const toks = (n: number, base = 100) => Array.from({ length: n }, (_, i) => base + i);

function record(id: string, p: FakePublisher, replay = true): WorkerRecord {
  return {
    id,
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm",
    role: "mixed",
    url: "http://127.0.0.1:1",
    connector: { kind: "none" },
    blockSize: BS,
    kvEvents: {
      endpoint: p.endpoint,
      replayEndpoint: replay ? p.replayEndpoint : undefined,
      topic: p.topic,
      framing: "seq",
    },
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
  };
}

const closers: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

async function setup(replay = true) {
  const pub = new FakePublisher();
  await pub.start();
  closers.push(() => pub.close());
  const disc = new MemoryDiscovery();
  const index = new KvIndex();
  const ingest = new KvIngest({ watcher: disc, index, logger, replayTimeoutMs: 1000 });
  closers.push(() => ingest.close());
  ingest.start();
  return { pub, disc, index, ingest, rec: record("w1", pub, replay) };
}

test("start-up replay from seq 0 builds the index from events sent before the server existed", async () => {
  const { pub, disc, index, ingest, rec } = await setup();
  const p = toks(16);
  await pub.publish([storedWire([11, 12], null, p.slice(0, 8), BS)]);
  await pub.publish([storedWire([13, 14], 12, p.slice(8, 16), BS)]);
  disc.put(rec);
  await ingest.synced();
  assert.deepEqual([...index.overlaps(p, ["w1"])], [4]);
  // Live events after the replay, once the SUB's subscription has reached the PUB.
  await waitFor(() => ingest.subscriber("w1")!.stats.lastSeq >= 1);
  await pub.subscribed();
  await pub.publish([removedWire([13, 14])]);
  await waitFor(() => index.overlaps(p, ["w1"])[0] === 2, 3000, "removal applied");
  assert.equal(ingest.subscriber("w1")!.stats.replays, 1);
});

test("a dropped message is recovered by replay; a gap beyond the buffer resets the worker", async () => {
  const { pub, disc, index, ingest, rec } = await setup();
  disc.put(rec);
  await ingest.synced();
  await pub.subscribed(); // the SUB's subscription has reached the PUB
  const p = toks(24, 5000);
  await pub.publish([storedWire([1, 2], null, p.slice(0, 8), BS)]);
  await pub.publish([storedWire([3], 2, p.slice(8, 12), BS)], { drop: true }); // missed by the subscriber
  await pub.publish([storedWire([4], 3, p.slice(12, 16), BS)]); // seq gap → replay from the missed seq
  await waitFor(() => index.overlaps(p, ["w1"])[0] === 4, 3000, "replay fills the gap");
  const sub = ingest.subscriber("w1")!;
  assert.equal(sub.stats.gaps, 1);
  assert.equal(sub.stats.replays, 2);

  assert.equal(sub.sync, "synced");
  assert.equal(sub.stats.resets, 0, "a gap the replay fills leaves the rank as it was");

  // Now the engine's buffer is too short to cover a gap: the rank's old entries are dropped and
  // it is unknown (overlap -1: routed on what this server sent it), not empty.
  pub.bufferSteps = 1;
  await pub.publish([storedWire([5], 4, p.slice(16, 20), BS)], { drop: true });
  await pub.publish([storedWire([6], 5, p.slice(20, 24), BS)], { drop: true });
  await pub.publish([storedWire([21, 22], null, toks(8, 9000), BS)]);
  await waitFor(() => sub.stats.resets === 1, 3000, "reset");
  assert.equal(sub.sync, "unknown");
  assert.equal(index.syncOf("w1"), "unknown");
  assert.equal(index.hasWorker("w1"), false);
  assert.deepEqual([...index.overlaps(p, ["w1"])], [-1]);
  assert.deepEqual([...index.overlaps(toks(8, 9000), ["w1"])], [-1]);
  // It keeps learning meanwhile: only the batch after the hole is held.
  assert.equal(index.blockCount("w1"), 2);
  // The engine evicts a block stored after the hole: its LRU has freed everything older, so
  // the rank is rebuilt.
  await pub.publish([removedWire([22])]);
  await waitFor(() => sub.sync === "synced", 3000, "rebuilt by an eviction");
  assert.deepEqual([...index.overlaps(toks(8, 9000), ["w1"])], [1]);
  assert.deepEqual([...index.overlaps(p, ["w1"])], [0]);
});

test("without a replay socket a gap resets; malformed frames are counted, not fatal; worker gone drops entries", async () => {
  const { pub, disc, index, ingest, rec } = await setup(false);
  disc.put(rec);
  await ingest.synced();
  await pub.subscribed();
  const sub = ingest.subscriber("w1")!;
  // Without a replay socket nothing before the first live batch can be had...
  assert.equal(sub.sync, "unknown");
  const p = toks(8, 7000);
  await pub.publish([storedWire([1, 2], null, p, BS)]);
  // ...but a first batch numbered 0 says there was nothing before it.
  await waitFor(() => index.overlaps(p, ["w1"])[0] === 2, 3000, "first batch");
  assert.equal(sub.sync, "synced");
  await pub.sendRaw([pub.topic, "not-8-bytes", "x"]);
  await pub.sendRaw([pub.topic, Buffer.alloc(8), Buffer.from([0xc1])]);
  await pub.publish([{ type: "Bogus" }, storedWire([3], 2, toks(4, 1), BS)]);
  await waitFor(() => sub.stats.malformed >= 3, 3000, "malformed counted");
  assert.equal(index.blockCount("w1"), 3);
  await pub.publish([], { drop: true });
  await pub.publish([storedWire([9], null, toks(4, 1), BS)]);
  await waitFor(() => sub.stats.resets === 1, 3000, "reset without replay");
  assert.equal(index.blockCount("w1"), 1);
  assert.equal(sub.sync, "unknown");
  disc.remove("w1");
  assert.equal(index.hasWorker("w1"), false);
  assert.equal(ingest.tracks("w1"), false);
});

test("ATOM framing ([topic, payload], no seq, no replay socket) feeds the index", async () => {
  const { pub, disc, index, ingest, rec } = await setup(false);
  disc.put({ ...rec, engine: "atom", kvEvents: { ...rec.kvEvents!, framing: "atom" } });
  await ingest.synced();
  await pub.subscribed();
  const p = toks(12, 3000);
  await pub.publishAtom([storedWire([1, 2, 3], null, p, BS)]);
  // No sequence numbers and no replay: the engine's history before us cannot be had, so the
  // rank is unknown (-1) while the index learns...
  await waitFor(() => index.blockCount("w1") === 3, 3000, "atom batch applied");
  assert.deepEqual([...index.overlaps(p, ["w1"])], [-1]);
  assert.equal(index.syncOf("w1"), "unknown");
  // ...until the engine moves a block it stored since out of GPU: older blocks are gone first.
  await pub.publishAtom([["BlockTransferred", [3], "GPU", "CPU", 0]]);
  await waitFor(() => index.overlaps(p, ["w1"])[0] === 2, 3000, "transfer out of GPU applied");
  assert.equal(index.syncOf("w1"), "synced");
});
