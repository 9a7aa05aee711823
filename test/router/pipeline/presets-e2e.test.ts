/**
 * End to end: real simulated engines (child processes publishing vLLM-format KV events over
 * ZMQ), `infera server` in-process with the kv-aware policy and the ZMQ ingest, the openai client.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { KvIngest } from "../../../src/kv/feeds/zmq-ingest.ts";
import type { KvIndex } from "../../../src/kv/index.ts";
import { createServerKvIngest, type ServerKvIngestHandle } from "../../../src/kv/server-ingest.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../../src/util/log.ts";
import { kvEventsReceived, type SimProcess, simWorkerRecord, startSim } from "../../helpers/sim.ts";
import { waitFor } from "../../kv/fake-publisher.ts";
import { presetScheduler } from "./preset.ts";

const BS = 16;
const MODEL = "sim-model";
const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();
const ids = ["w-a", "w-b", "w-c"];
let sims: SimProcess[] = [];
let disc: MemoryDiscovery;
let server: InferaServer;
let index: KvIndex;

function record(id: string, s: SimProcess): WorkerRecord {
  return simWorkerRecord(s, { id, model: MODEL, maxModelLen: 32768, blockSize: BS });
}

const docs = ["alpha", "bravo", "charlie", "delta"].map((w) =>
  Array.from(
    { length: 60 },
    (_, i) => `The ${w} manual, section ${i}, covers procedure ${w}-${i * 13}.`,
  ).join(" "),
);
const chatOf = (doc: string, q: string) => [
  { role: "system" as const, content: doc },
  { role: "user" as const, content: q },
];
const promptTokens = (doc: string, q: string) => tok.encode(tok.applyChatTemplate(chatOf(doc, q)));

/** Sends a chat straight to one sim (bypassing the router), so only that engine caches it. */
async function direct(s: SimProcess, doc: string, q: string, salt?: string): Promise<void> {
  const r = await fetch(`${s.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: chatOf(doc, q), max_tokens: 2, cache_salt: salt }),
  });
  assert.equal(r.status, 200, await r.text());
}

before(async () => {
  // 120 blocks per sim: 1,920 tokens, so two more ~900-token documents force eviction.
  // w-b publishes newer vLLM's map-encoded events, the others positional arrays.
  sims = await Promise.all(
    ids.map((id) =>
      startSim({
        args: [
          ...["--block-size", String(BS), "--num-gpu-blocks", "120", "--speed", "20"],
          ...(id === "w-b" ? ["--kv-events-encoding", "map"] : []),
        ],
      }),
    ),
  );
  disc = new MemoryDiscovery(ids.map((id, i) => record(id, sims[i])));
  server = await startServer(
    // recentRoutingMs 0: choices from the KV events alone, so the BlockRemoved effect is exact.
    {
      host: "127.0.0.1",
      port: 0,
      policy: "kv-aware",
      scrapeIntervalMs: 0,
      policyOptions: { recentRoutingMs: 0 },
    },
    { discovery: disc, extensions: { kvIngestFactory: createServerKvIngest }, logger },
  );
  const handle = server.kvIngest as ServerKvIngestHandle;
  index = handle.ingest!.index;
  await handle.ingest!.synced();
  // Every sim's events reach the index before a test relies on them (no "SUB joined" sleep).
  await Promise.all(sims.map((s, i) => kvEventsReceived(s, () => index.blockCount(ids[i]) > 0)));
});

after(async () => {
  await server?.close();
  await Promise.all(sims.map((s) => s.stop()));
});

test("through infera server: a request goes to the worker holding its prefix, and not after BlockRemoved", async () => {
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "x", maxRetries: 0 });
  await direct(sims[2], docs[0], "warm-up");
  const want = Math.floor(promptTokens(docs[0], "q").length / BS) - 2;
  await waitFor(() => index.overlaps(promptTokens(docs[0], "q1"), ids)[2] >= want, 5000, "w-c indexed");
  assert.deepEqual([...index.overlaps(promptTokens(docs[0], "q1"), ids)].slice(0, 2), [0, 0]);
  const res = await client.chat.completions.create({
    model: MODEL,
    messages: chatOf(docs[0], "q1"),
    max_tokens: 4,
  });
  const cached = res.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(cached >= want * BS, `expected a prefix hit on w-c, cached_tokens=${cached}`);
  const metrics = await (await fetch(`${server.url}/metrics`)).text();
  assert.match(metrics, /infera_kv_routing_decisions_total\{reason="overlap"\} 1/);
  assert.match(metrics, /infera_kv_events_total\{type="BlockStored"\} [1-9]/);
  // kv-aware bridges the routed prompt until the events confirm it: the entry is counted.
  assert.match(metrics, /infera_routing_bridge_entries_total\{model="sim-model",event="added"\} 1\n/);

  // Push docs[0] out of w-c's 120-block pool with other documents: BlockRemoved events follow.
  const removedBefore = index.counters.removed;
  for (const d of docs.slice(1)) await direct(sims[2], d, "evict");
  await waitFor(() => index.overlaps(promptTokens(docs[0], "q2"), ids)[2] === 0, 10000, "w-c evicted");
  assert.ok(index.counters.removed > removedBefore, "eviction arrived as BlockRemoved events");
  const sel = server.router.policyFor(MODEL).select(
    {
      requestId: "probe",
      model: MODEL,
      endpoint: "chat",
      body: {},
      stream: false,
      promptText: () => tok.applyChatTemplate(chatOf(docs[0], "q2")),
      promptTokens: () => promptTokens(docs[0], "q2"),
    },
    server.workers.group(MODEL)!.available,
  );
  assert.notEqual(sel.worker.record.id, "w-c");
  assert.equal(sel.overlapBlocks, 0);
});

test("cache_salt: a salted prefix is only a hit for the same salt", async () => {
  await direct(sims[1], docs[1], "salted", "tenant-1");
  const t = promptTokens(docs[1], "q");
  await waitFor(() => index.overlaps(t, ids, "tenant-1")[1] > 10, 5000, "salted blocks indexed");
  assert.equal(index.overlaps(t, ids, "tenant-2")[1], 0);
  assert.equal(index.overlaps(t, ids)[1], 0);
});

test("a new replica builds the full index by replay, and two replicas choose alike", async () => {
  // Events this ingest never saw live (published before it existed) come from the replay sockets.
  await direct(sims[0], docs[3], "for the replicas");
  // The live index has them too, so that it is a fair reference for the replicas' replay.
  await waitFor(() => index.overlaps(promptTokens(docs[3], "q"), ids)[0] > 10, 5000, "w-a indexed");
  const replicas = [new KvIngest({ watcher: disc, logger }), new KvIngest({ watcher: disc, logger })];
  try {
    for (const r of replicas) r.start();
    await Promise.all(replicas.map((r) => r.synced()));
    for (const id of ids)
      assert.equal(replicas[0].index.blockCount(id), index.blockCount(id), `replayed index of ${id}`);
    assert.ok(replicas[0].index.overlaps(promptTokens(docs[3], "q"), ids)[0] > 10);
    const ws = (): WorkerState[] =>
      disc.workers().map((record) => ({ record, inFlight: 0, pendingPrefillTokens: 0, available: true }));
    const pols = replicas.map((r) => presetScheduler("kv-aware", { logger, kvIndex: r.index }));
    for (const [i, d] of docs.entries()) {
      const text = tok.applyChatTemplate(chatOf(d, `question ${i}`));
      const req = {
        requestId: `r${i}`,
        model: MODEL,
        endpoint: "chat" as const,
        body: {},
        stream: false,
        promptText: () => text,
        promptTokens: () => tok.encode(text),
      };
      assert.equal(
        pols[0].select(req, ws()).worker.record.id,
        pols[1].select(req, ws().reverse()).worker.record.id,
      );
    }
  } finally {
    await Promise.all(replicas.map((r) => r.close()));
  }
});

test("closing the router unsubscribes its policies from the KV index (no listener leak)", () => {
  // The kv-aware bridge listens to the index's removals; the index outlives the router.
  assert.equal(index.removalListenerCount, 1);
  server.router.close();
  assert.equal(index.removalListenerCount, 0);
  // A policy built again (a restarted router, a rebuilt profile) subscribes once more, alone.
  server.router.policyFor(MODEL).select(
    {
      requestId: "again",
      model: MODEL,
      endpoint: "chat",
      body: {},
      stream: false,
      promptText: () => "x",
      promptTokens: () => [1, 2, 3],
    },
    server.workers.group(MODEL)!.available,
  );
  assert.equal(index.removalListenerCount, 1);
  server.router.close();
  assert.equal(index.removalListenerCount, 0);
});
