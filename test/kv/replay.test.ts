/**
 * Start-up sync against a long history (thousands of batches in the engine's replay buffer),
 * through real ZMQ sockets. What the engine does is vLLM's ZmqEventPublisher
 * (vllm-project/vllm vllm/distributed/kv_events.py at 0181ea3173e5, `_service_replay`): every
 * buffered batch with seq >= start on a ROUTER, then END_SEQ (-1); a ROUTER drops replies past
 * its send high-water mark (libzmq's default 1000), which FakePublisher's `dropReply` stands in
 * for, deterministically.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { KvIngest } from "../../src/kv/feeds/zmq-ingest.ts";
import { KvIndex } from "../../src/kv/index.ts";
import { createLogger } from "../../src/util/log.ts";
import { removedWire, storedWire } from "../helpers/kv-events.ts";
import { FakePublisher, waitFor } from "./fake-publisher.ts";

const BS = 4;
const HISTORY = 3000;
const logger = createLogger("test", {});
logger.level = "silent";
/** Batch i stores prompt i's two blocks (engine hashes 2i+1, 2i+2). */
const promptOf = (i: number) => Array.from({ length: 2 * BS }, (_, k) => 1000 + i * 8 + k);

function record(id: string, p: FakePublisher, replay: boolean, kvBlocks?: number): WorkerRecord {
  return {
    id,
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm",
    role: "mixed",
    url: "http://127.0.0.1:1",
    connector: { kind: "none" },
    blockSize: BS,
    kvBlocks,
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

/** A publisher whose buffer holds HISTORY batches sent before any server existed. */
async function engineWithHistory(): Promise<FakePublisher> {
  const pub = new FakePublisher();
  await pub.start();
  closers.push(() => pub.close());
  for (let i = 0; i < HISTORY; i++)
    await pub.publish([storedWire([2 * i + 1, 2 * i + 2], null, promptOf(i), BS)], { drop: true });
  return pub;
}

/**
 * The replay stall timeout where replies are dropped: long enough that a loaded box's slow
 * replay is not taken for a stall (at 300 ms, three rounds "failed" at load average 23 and the
 * rank went unknown), as short as the dropped end markers allow (each waits it out).
 */
const STALL_MS = 1500;

function ingestFor(rec: WorkerRecord, replayTimeoutMs = 1000) {
  const index = new KvIndex();
  const ingest = new KvIngest({ watcher: new MemoryDiscovery([rec]), index, logger, replayTimeoutMs });
  closers.push(() => ingest.close());
  ingest.start();
  return { index, ingest };
}

test("a long history with replies dropped in transit is resumed, not reset: every batch applied", async () => {
  const pub = await engineWithHistory();
  // The first answer loses a batch in the middle and its end marker; the second loses the tail's
  // end marker again: each time the reader must ask again from the next missing seq.
  pub.dropReply = (seq, request) =>
    (request === 0 && (seq === 1500 || seq === -1)) || (request === 1 && seq === -1);
  const { index, ingest } = ingestFor(record("w1", pub, true), STALL_MS);
  const sub = ingest.subscriber("w1")!;
  assert.equal(sub.sync, "syncing");
  assert.equal(index.syncOf("w1"), "syncing");
  assert.deepEqual([...index.overlaps(promptOf(0), ["w1"])], [-1], "not routed on a half-built view");
  await ingest.synced();
  assert.equal(sub.sync, "synced");
  assert.equal(sub.stats.resets, 0);
  assert.equal(sub.stats.lastSeq, HISTORY - 1);
  assert.ok(sub.stats.replayRounds >= 3, `rounds ${sub.stats.replayRounds}`);
  assert.equal(index.blockCount("w1"), 2 * HISTORY);
  for (const i of [0, 1500, HISTORY - 1])
    assert.deepEqual([...index.overlaps(promptOf(i), ["w1"])], [2], `prompt ${i}`);
  assert.ok(ingest.syncReport().ranks[0].syncMs !== null);
});

test("a gap during operation whose replay loses replies in transit is resumed: the rank is never emptied", async () => {
  const pub = await engineWithHistory();
  const { index, ingest } = ingestFor(record("w1", pub, true), STALL_MS);
  await ingest.synced();
  const sub = ingest.subscriber("w1")!;
  await pub.subscribed(); // the SUB has joined
  // 500 batches the subscriber misses, then one it sees: a gap of 500.
  for (let i = HISTORY; i < HISTORY + 500; i++)
    await pub.publish([storedWire([2 * i + 1, 2 * i + 2], null, promptOf(i), BS)], { drop: true });
  pub.dropReply = (seq, request) => request === 1 && (seq === HISTORY + 250 || seq === -1);
  const last = HISTORY + 500;
  await pub.publish([storedWire([2 * last + 1, 2 * last + 2], null, promptOf(last), BS)]);
  await waitFor(() => sub.stats.lastSeq === last, 5000, "gap filled");
  assert.equal(sub.stats.gaps, 1);
  assert.equal(sub.stats.resets, 0);
  assert.equal(sub.sync, "synced");
  assert.ok(pub.requests >= 3, `replay requests ${pub.requests}`);
  assert.equal(index.blockCount("w1"), 2 * (last + 1));
  for (const i of [0, HISTORY + 250, last])
    assert.deepEqual([...index.overlaps(promptOf(i), ["w1"])], [2], `prompt ${i}`);
});

test("a history older than the buffer: the rank is unknown (-1), not empty, until the engine evicts", async () => {
  const pub = await engineWithHistory();
  pub.bufferSteps = 1000;
  await pub.publish([], { drop: true }); // trims the buffer to the last 1000 batches
  const { index, ingest } = ingestFor(record("w1", pub, true));
  await ingest.synced();
  const sub = ingest.subscriber("w1")!;
  assert.equal(sub.sync, "unknown");
  assert.equal(sub.stats.resets, 0);
  assert.equal(index.hasWorker("w1"), false, "routed as untracked: the caller's fallback decides");
  // What the buffer had is kept (and used once rebuilt), what it lost is not claimed either way.
  assert.deepEqual([...index.overlaps(promptOf(HISTORY - 1), ["w1"])], [-1]);
  assert.equal(index.blockCount("w1"), 2 * 999);
  // An eviction of a block the index saw stored: the LRU has freed everything older first.
  await pub.subscribed();
  await pub.publish([removedWire([2 * (HISTORY - 999) + 1])]);
  await waitFor(() => sub.sync === "synced", 3000, "rebuilt");
  assert.deepEqual([...index.overlaps(promptOf(HISTORY - 1), ["w1"])], [2]);
});

test("without a replay socket an engine with history is unknown, not empty, and keeps learning", async () => {
  const pub = await engineWithHistory();
  const { index, ingest } = ingestFor(record("w1", pub, false, 10));
  await ingest.synced();
  const sub = ingest.subscriber("w1")!;
  assert.equal(sub.sync, "unknown");
  await pub.subscribed();
  const p = promptOf(HISTORY + 1);
  await pub.publish([storedWire([9001, 9002], null, p, BS)]);
  await waitFor(() => index.blockCount("w1") === 2, 3000, "live batch applied");
  assert.equal(sub.sync, "unknown", "seq 3000 is not the engine's first batch");
  assert.deepEqual([...index.overlaps(p, ["w1"])], [-1]);
  assert.equal(sub.stats.resets, 0);
  // A pool's worth of stores (kvBlocks 10) since the hole: the cache has turned over.
  for (let i = 0; i < 4; i++)
    await pub.publish([storedWire([9100 + 2 * i, 9101 + 2 * i], null, promptOf(HISTORY + 10 + i), BS)]);
  await waitFor(() => sub.sync === "synced", 3000, "rebuilt by turnover");
  assert.deepEqual([...index.overlaps(p, ["w1"])], [2]);
});

test("an engine whose replay never answers: syncing, then unknown; the index keeps what arrives live", async () => {
  const pub = await engineWithHistory();
  pub.silent = true;
  const { index, ingest } = ingestFor(record("w1", pub, true), 200);
  const sub = ingest.subscriber("w1")!;
  assert.equal(sub.sync, "syncing");
  await ingest.synced();
  assert.equal(sub.sync, "unknown");
  assert.equal(index.syncOf("w1"), "unknown");
  assert.equal(sub.stats.resets, 0);
  // The third request may still be on its way to the publisher's ROUTER when the feed gives up.
  await waitFor(() => pub.requests >= 3, 3000, `3 replay requests (got ${pub.requests})`);
});
