/**
 * What idle ZMQ feeds cost (bench/kv-ingest/RESULTS.md "Idle"): N feeds, each connected to a
 * bound PUB that sends nothing (same process, ipc:// so no port can clash on a shared box),
 * CPU of the whole process over 5 s after a 1 s settle.
 *
 *   node bench/kv-ingest/idle.ts <native|zeromq> [N=256]
 */
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Publisher } from "zeromq";
import { ZmqKvFeed } from "../../src/kv/feeds/zmq.ts";
import { KvIndex } from "../../src/kv/index.ts";
import { createLogger } from "../../src/util/log.ts";
import { exitWithUsageIfAsked } from "../usage.ts";

exitWithUsageIfAsked(import.meta.url, process.argv.slice(2));
const reader = process.argv[2] === "zeromq" ? "zeromq" : "native";
const n = Number(process.argv[3] ?? 256);
const dir = mkdtempSync(join(tmpdir(), "kv-idle-"));
const pubs: Publisher[] = [];
for (let i = 0; i < n; i++) {
  const p = new Publisher({ linger: 0 });
  await p.bind(`ipc://${dir}/pub-${i}`);
  pubs.push(p);
}
const logger = createLogger("kv-idle");
logger.level = "silent";
const index = new KvIndex();
const feeds = pubs.map((_, i) => {
  const f = new ZmqKvFeed({
    workerId: `w${i}`,
    events: { endpoint: `ipc://${dir}/pub-${i}`, topic: "", framing: "seq" },
    blockSize: 16,
    index,
    logger,
    replayOnStart: false,
    reader,
  });
  f.start();
  return f;
});
await new Promise((r) => setTimeout(r, 1000));
const c0 = process.cpuUsage();
const t0 = performance.now();
await new Promise((r) => setTimeout(r, 5000));
const c = process.cpuUsage(c0);
const ms = performance.now() - t0;
console.log(
  `${reader} × ${n} idle feeds: ${(((c.user + c.system) / 1000 / ms) * 100).toFixed(2)} % of a core`,
);
await Promise.all(feeds.map((f) => f.close()));
for (const p of pubs) p.close();
process.exit(0);
