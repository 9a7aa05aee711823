/**
 * GET /ready, /dashboard/state and /debug/decisions report the KV index's sync per rank. Two
 * engines (real ZMQ PUB + ROUTER replay sockets, vLLM's replay protocol: test/kv/fake-publisher.ts)
 * with a history each: one answers its replay, the other's replay stalls (never answers), so it is
 * `syncing` until the stall timeouts run out and `unknown` after. /ready holds the server out only
 * while a rank is `syncing`, and only for `ingest.readyWaitKvSyncMs`.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { createServerKvIngest } from "../../src/kv/server-ingest.ts";
import { type InferaServer, startServer } from "../../src/server/app.ts";
import { createLogger } from "../../src/util/log.ts";
import { storedWire } from "../helpers/kv-events.ts";
import { FakePublisher } from "../kv/fake-publisher.ts";

const BS = 16;
const logger = createLogger("test");
logger.level = "silent";

function record(id: string, p: FakePublisher): WorkerRecord {
  return {
    id,
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm",
    role: "mixed",
    url: "http://127.0.0.1:1",
    connector: { kind: "none" },
    blockSize: BS,
    kvEvents: { endpoint: p.endpoint, replayEndpoint: p.replayEndpoint, topic: p.topic, framing: "seq" },
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

async function engine(history: number, silent: boolean): Promise<FakePublisher> {
  const pub = new FakePublisher();
  await pub.start();
  closers.push(() => pub.close());
  for (let i = 0; i < history; i++) {
    const toks = Array.from({ length: BS }, (_, k) => 10 + i * BS + k);
    await pub.publish([storedWire([i + 1], null, toks, BS)], { drop: true });
  }
  pub.silent = silent;
  return pub;
}

async function serve(pubs: FakePublisher[], readyWaitKvSyncMs?: number): Promise<InferaServer> {
  const disc = new MemoryDiscovery(pubs.map((p, i) => record(`w${i}`, p)));
  const server = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "kv-aware",
      scrapeIntervalMs: 0,
      // The replay stall limit sets how long the silent engine stays `syncing` (three rounds
      // of it) but must also let the answering engine's 2,000-batch replay through: at 400 ms
      // a loaded machine (load 30) stalled that one too, and both ended `unknown`.
      ingest: { kvReplayTimeoutMs: 1500, ...(readyWaitKvSyncMs !== undefined ? { readyWaitKvSyncMs } : {}) },
    },
    { discovery: disc, extensions: { kvIngestFactory: createServerKvIngest }, logger },
  );
  closers.push(() => server.close());
  return server;
}

interface Ready {
  ready: boolean;
  workers: number;
  kvIndex?: { synced: number; syncing: number; unknown: number; waiting: boolean };
}

async function ready(server: InferaServer): Promise<{ status: number; body: Ready }> {
  const r = await fetch(`${server.url}/ready`);
  return { status: r.status, body: (await r.json()) as Ready };
}

test("/ready waits while a rank syncs, then reports synced and unknown ranks by count", async () => {
  const server = await serve([await engine(2000, false), await engine(2000, true)]);
  const first = await ready(server);
  assert.equal(first.status, 503, JSON.stringify(first.body));
  assert.equal(first.body.kvIndex?.waiting, true);
  assert.ok((first.body.kvIndex?.syncing ?? 0) >= 1);

  // Until no rank syncs (the silent one's three stalled rounds, ~4.5 s); generous for a loaded box.
  let last = first;
  for (const t0 = Date.now(); last.body.kvIndex?.syncing !== 0 && Date.now() - t0 < 60_000; ) {
    await new Promise((r) => setTimeout(r, 100));
    last = await ready(server);
  }
  assert.equal(last.status, 200, JSON.stringify(last.body));
  assert.deepEqual(last.body.kvIndex, { synced: 1, syncing: 0, unknown: 1, waiting: false });

  const state = (await (await fetch(`${server.url}/dashboard/state`)).json()) as {
    models: Array<{ workers: Array<{ id: string; indexSync: string | null; indexBlocks: number | null }> }>;
    kvIndex: { ranks: Array<{ worker: string; rank: number; state: string; syncMs: number | null }> };
  };
  const byId = new Map(state.models[0].workers.map((w) => [w.id, w]));
  assert.equal(byId.get("w0")?.indexSync, "synced");
  assert.equal(byId.get("w0")?.indexBlocks, 2000);
  assert.equal(byId.get("w1")?.indexSync, "unknown");
  assert.equal(byId.get("w1")?.indexBlocks, 0, "tracked, though unknown");
  const ranks = [...state.kvIndex.ranks].sort((a, b) => a.worker.localeCompare(b.worker));
  assert.deepEqual(
    ranks.map((r) => [r.worker, r.rank, r.state, r.syncMs === null]),
    [
      ["w0", 0, "synced", false],
      ["w1", 0, "unknown", true],
    ],
  );

  // A request is routed (and fails upstream: nobody listens there); its decision says which
  // candidates' cached blocks came from the engines' events.
  await fetch(`${server.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", prompt: "hello there", max_tokens: 1 }),
  });
  const dec = (await (await fetch(`${server.url}/debug/decisions`)).json()) as {
    data: Array<{ candidates: Array<{ worker: string; indexSync?: string | null }> }>;
  };
  assert.ok(dec.data.length > 0);
  const sync = new Map(dec.data[0].candidates.map((c) => [c.worker, c.indexSync]));
  assert.equal(sync.get("w0"), "synced");
  assert.equal(sync.get("w1"), "unknown");
});

test("the wait is bounded: with readyWaitKvSyncMs 0 a syncing rank does not hold /ready", async () => {
  const server = await serve([await engine(10, true)], 0);
  const r = await ready(server);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.kvIndex?.syncing, 1);
  assert.equal(r.body.kvIndex?.waiting, false);
});
