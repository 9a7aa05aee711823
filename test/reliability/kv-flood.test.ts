/**
 * One publisher floods the router with 4M stored blocks (issue #17): the index must stay within
 * its per-rank cap (the record's kvBlocks + margin, or the default when unknown), count what it
 * drops, and the server's event loop must keep answering /health meanwhile.
 *
 * Real ZMQ PUB/ROUTER sockets in vLLM framing (test/kv/fake-publisher.ts; vllm-project/vllm
 * vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34), a real KvIngest,
 * and a plain HTTP /health server on the same event loop, probed every 20 ms.
 */
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";
import { Registry } from "prom-client";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { KvIngest } from "../../src/kv/feeds/zmq-ingest.ts";
import { DEFAULT_MAX_BLOCKS, KvIndex } from "../../src/kv/index.ts";
import { createLogger } from "../../src/util/log.ts";
import { storedWire } from "../helpers/kv-events.ts";
import { FakePublisher, waitFor } from "../kv/fake-publisher.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
const closers: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c().catch(() => {});
  fileDone(import.meta.url);
});

const TOTAL = 4_000_000;
const PER_BATCH = 10_000;

function probe(port: number): Promise<number> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    const req = request({ port, path: "/health", agent: false }, (res) => {
      res.resume();
      res.on("end", () => resolve(performance.now() - t0));
    });
    req.on("error", () => resolve(Number.POSITIVE_INFINITY));
    req.end();
  });
}

test("4M blocks from one publisher: index capped, drops counted, /health stays responsive", async () => {
  const logger = createLogger("test", {});
  logger.level = "silent";
  const pub = new FakePublisher();
  await pub.start();
  closers.push(() => pub.close());
  const health = createServer((_q, s) => s.end("ok"));
  await new Promise<void>((r) => health.listen(0, "127.0.0.1", r));
  closers.push(() => new Promise<void>((r) => health.close(() => r())));
  const port = (health.address() as AddressInfo).port;

  const disc = new MemoryDiscovery();
  const index = new KvIndex();
  const registry = new Registry();
  const ingest = new KvIngest({ watcher: disc, index, logger, registry, replayTimeoutMs: 5000 });
  closers.push(() => ingest.close());
  ingest.start();
  const rec: WorkerRecord = {
    id: "flood",
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm",
    role: "mixed",
    url: "http://127.0.0.1:1",
    connector: { kind: "none" },
    blockSize: 1,
    kvEvents: {
      endpoint: pub.endpoint,
      replayEndpoint: pub.replayEndpoint,
      topic: pub.topic,
      framing: "seq",
    },
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
  };
  disc.put(rec);
  await ingest.synced();
  await pub.subscribed(); // the SUB has joined: the flood below is received, not dropped
  global.gc?.();
  const mem0 = process.memoryUsage();

  let probing = true;
  const lat: number[] = [];
  const prober = (async () => {
    while (probing) {
      lat.push(await probe(port));
      await new Promise((r) => setTimeout(r, 20));
    }
  })();

  const t0 = performance.now();
  // Each batch a sequence of its own (parent null): past the cap a chained batch would be an
  // orphan (its parent dropped), counted as such rather than as a cap drop.
  for (let b = 0; b < TOTAL / PER_BATCH; b++) {
    const base = b * PER_BATCH + 1;
    const hashes = Array.from({ length: PER_BATCH }, (_, i) => base + i);
    await pub.publish([storedWire(hashes, null, hashes, 1)]);
    await new Promise((r) => setImmediate(r)); // the publisher shares this event loop: let it breathe
  }
  const sub = ingest.subscriber("flood")!;
  await waitFor(() => sub.stats.lastSeq === TOTAL / PER_BATCH - 1, 120_000, "flood applied");
  const applyS = (performance.now() - t0) / 1000;
  probing = false;
  await prober;
  const mem1 = process.memoryUsage();

  const held = index.blockCount("flood");
  const dropped = index.counters.capped;
  const metric = (await registry.getMetricsAsJSON()).find(
    (m) => m.name === "infera_kv_index_dropped_blocks_total",
  );
  const metricDrops = metric?.values.reduce((a, v) => a + Number(v.value), 0) ?? 0;
  const grewMB = (mem1.heapUsed + mem1.arrayBuffers - (mem0.heapUsed + mem0.arrayBuffers)) / 2 ** 20;
  const tablesMB = index.bytes() / 2 ** 20;
  lat.sort((a, b) => a - b);
  const p99 = lat[Math.floor(lat.length * 0.99)] ?? 0;
  const worst = lat[lat.length - 1] ?? 0;

  record(
    import.meta.url,
    "kv flood: index cap",
    `4M blocks sent, ${held} indexed (cap ${DEFAULT_MAX_BLOCKS}), ${dropped} dropped (metric ${metricDrops}), tables ${tablesMB.toFixed(1)} MiB, heap+buffers +${grewMB.toFixed(0)} MiB, ${applyS.toFixed(1)} s`,
    "indexed ≤ cap, drops counted, +memory < 150 MiB",
    held <= DEFAULT_MAX_BLOCKS && dropped === TOTAL - held && metricDrops === dropped && grewMB < 150,
  );
  record(
    import.meta.url,
    "kv flood: /health during ingest",
    `${lat.length} probes, p99 ${p99.toFixed(0)} ms, worst ${worst.toFixed(0)} ms`,
    "worst < 1000 ms (2 shared cores)",
    worst < 1000,
  );
  assert.ok(held <= DEFAULT_MAX_BLOCKS);
  assert.equal(held + dropped, TOTAL);
  assert.equal(metricDrops, dropped);
  assert.ok(grewMB < 150, `grew ${grewMB} MiB`);
  assert.ok(worst < 1000, `worst /health ${worst} ms`);
});
