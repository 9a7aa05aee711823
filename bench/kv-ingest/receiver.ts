/**
 * The server side of bench/kv-ingest: one KvSubscriber (the code under test, from `--src`, a
 * checkout's root, default this one) on the publisher's endpoint, feeding a KvIndex, no replay
 * socket and no start-up replay (the publisher starts with us). Counts from the first batch
 * applied to the last (or until nothing arrives for 1 s): messages, msg/s, CPU µs per message
 * (process.cpuUsage, every thread of the process), sequence gaps. Prints one JSON line.
 *
 *   node [--cpu-prof] bench/kv-ingest/receiver.ts <endpoint> <n> <src> <reader>
 */
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [endpoint, nArg, src, reader] = process.argv.slice(2);
const N = Number(nArg);
const root = pathToFileURL(`${resolve(src)}/`);
const { KvIndex } = await import(new URL("src/kv/index.ts", root).href);
// The ZMQ feed: src/kv/feeds/zmq.ts (ZmqKvFeed) now, src/kv/subscriber.ts (KvSubscriber) before.
const moved = existsSync(new URL("src/kv/feeds/zmq.ts", root));
const feedModule = await import(new URL(moved ? "src/kv/feeds/zmq.ts" : "src/kv/subscriber.ts", root).href);
const KvSubscriber = moved ? feedModule.ZmqKvFeed : feedModule.KvSubscriber;
const { createLogger } = await import(new URL("src/util/log.ts", root).href);
const { KvIngestMetrics } = await import(new URL("src/kv/metrics.ts", root).href);
const { Registry } = await import("prom-client");

const logger = createLogger("kv-ingest-bench");
logger.level = "error";
const index = new KvIndex({ defaultMaxBlocks: 1 << 22 });
const sub = new KvSubscriber({
  workerId: "w0",
  events: { endpoint, topic: "", framing: "seq" },
  blockSize: 16,
  index,
  logger,
  replayOnStart: false,
  reader,
  // As the server's ingest gives it (src/kv/feeds/zmq-ingest.ts): counters per batch and event.
  metrics: new KvIngestMetrics(new Registry()),
});
sub.start();
await sub.synced;
process.stdout.write("ready\n");

let t0 = 0;
let n0 = 0;
let c0: NodeJS.CpuUsage | null = null;
let lastCount = 0;
let lastChange = 0;
await new Promise<void>((done) => {
  const tick = setInterval(() => {
    const n = sub.stats.batches;
    const now = performance.now();
    if (n > 0 && c0 === null) {
      // The first batches arrived within this 2 ms tick: counted from here, they are in.
      t0 = now;
      n0 = n;
      c0 = process.cpuUsage();
      lastCount = n;
      lastChange = now;
      return;
    }
    if (n !== lastCount) {
      lastCount = n;
      lastChange = now;
    }
    if (c0 !== null && (n >= N || now - lastChange > 1000)) {
      clearInterval(tick);
      done();
    }
  }, 2);
});
const cpu = process.cpuUsage(c0 ?? undefined);
const ms = lastChange - t0;
const counted = sub.stats.batches - n0;
process.stdout.write(
  `${JSON.stringify({
    received: sub.stats.batches,
    events: sub.stats.events,
    gaps: sub.stats.gaps,
    malformed: sub.stats.malformed,
    ms,
    rate: Math.round((counted / ms) * 1000),
    cpuUsPerMsg: (cpu.user + cpu.system) / counted,
    blocks: index.blockCount("w0", 0),
  })}\n`,
);
await sub.close();
process.exit(0);
