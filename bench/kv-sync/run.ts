/**
 * Start-up sync figure (issue #28 item 3): a server joining engines that already have history.
 * Starts `infera-sim --fleet N` (default 8 engines), gives each `--steps` (default 10,000) KV
 * event batches of long prompts (sent straight to the engines, token-id prompts, many chunked
 * prefill steps each, a pool small enough to evict), then starts an `infera server` (kv-aware,
 * ZMQ ingest, in this process) and prints, as it goes, each rank's sync state, then the time
 * until every rank is synced, how many ranks were reset (goal: 0), how many ended `unknown`, the
 * replay rounds, and when /ready turned 200.
 *
 *   node bench/kv-sync/run.ts [--engines 8] [--steps 10000] [--prompt 4096] [--chunk 512]
 *     [--blocks 4096] [--concurrency 64] [--replay-timeout 2000]
 */
import { loadavg } from "node:os";
import { Subscriber } from "zeromq";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { createServerKvIngest, type ServerKvIngestHandle } from "../../src/kv/server-ingest.ts";
import { startServer } from "../../src/server/app.ts";
import { createLogger } from "../../src/util/log.ts";
import { startEngines } from "../fleet-routing/engines.ts";
import { exitWithUsageIfAsked } from "../usage.ts";

const args = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, args);
const flag = (name: string, def: number) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : def;
};
const ENGINES = flag("engines", 8);
const STEPS = flag("steps", 10_000);
const PROMPT = flag("prompt", 4096);
const CHUNK = flag("chunk", 512);
const BLOCKS = flag("blocks", 4096);
const CONCURRENCY = flag("concurrency", 64);
const REPLAY_TIMEOUT = flag("replay-timeout", 2000);
const BS = 16;
const load = () =>
  loadavg()
    .map((x) => x.toFixed(2))
    .join(" ");
const t0 = performance.now();
const secs = () => ((performance.now() - t0) / 1000).toFixed(1);

console.log(
  `kv-sync: ${ENGINES} engines × ${STEPS} steps, prompts ${PROMPT} tokens in ${CHUNK}-token chunks, pool ${BLOCKS} blocks; load ${load()}`,
);
const fleet = await startEngines(ENGINES, [
  ...["--block-size", String(BS), "--num-gpu-blocks", String(BLOCKS)],
  ...["--max-num-batched-tokens", String(CHUNK), "--speed", "1000"],
]);
let exitCode = 0;
try {
  // Count each engine's published batches on its PUB socket (frames only, nothing decoded).
  const lastSeq = fleet.engines.map(() => -1);
  const subs = fleet.engines.map((e, i) => {
    const s = new Subscriber({ linger: 0, receiveHighWaterMark: 0 });
    s.connect(e.kvEndpoint);
    s.subscribe();
    void (async () => {
      try {
        for await (const frames of s)
          if (frames.length === 3) lastSeq[i] = Number(frames[1].readBigUInt64BE(0));
      } catch {
        // closed
      }
    })();
    return s;
  });
  await new Promise((r) => setTimeout(r, 300));

  // History: distinct long prompts, round-robin over the engines still short of STEPS.
  let sent = 0;
  let nextId = 0;
  const worker = async () => {
    for (;;) {
      const short = fleet.engines.map((_, i) => i).filter((i) => lastSeq[i] + 1 < STEPS);
      if (short.length === 0) return;
      const i = short[nextId++ % short.length];
      const base = nextId * 7919;
      const prompt = Array.from({ length: PROMPT }, (_, k) => 1000 + ((base + k * 31) % 30000));
      const r = await fetch(`${fleet.engines[i].url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "sim-model", prompt, max_tokens: 1 }),
      }).catch(() => null);
      await r?.arrayBuffer();
      sent++;
    }
  };
  const progress = setInterval(() => {
    const done = lastSeq.map((s) => s + 1);
    console.log(
      `  [${secs()} s] history: ${sent} requests, steps per engine min ${Math.min(...done)} max ${Math.max(...done)}; load ${load()}`,
    );
  }, 5000);
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  clearInterval(progress);
  await new Promise((r) => setTimeout(r, 500));
  for (const s of subs) s.close();
  const steps = lastSeq.map((s) => s + 1);
  console.log(
    `history ready after ${secs()} s: ${sent} requests; steps per engine ${steps.join(", ")}; load ${load()}`,
  );

  // The server joins now.
  const logger = createLogger("kv-sync");
  logger.level = "warn";
  const records: WorkerRecord[] = fleet.engines.map((e, i) => ({
    id: `e${i}`,
    model: "sim-model",
    servedModelNames: ["sim-model"],
    engine: "vllm",
    role: "mixed",
    url: e.url,
    connector: { kind: "none" },
    blockSize: BS,
    kvBlocks: BLOCKS,
    kvEvents: {
      endpoint: e.kvEndpoint,
      replayEndpoint: e.replayEndpoint ?? undefined,
      topic: "kv-events",
      framing: "seq",
    },
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 65536,
    startedAt: new Date().toISOString(),
  }));
  const s0 = performance.now();
  const server = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "kv-aware",
      scrapeIntervalMs: 0,
      ingest: { kvReplayTimeoutMs: REPLAY_TIMEOUT },
    },
    {
      discovery: new MemoryDiscovery(records),
      extensions: { kvIngestFactory: createServerKvIngest },
      logger,
    },
  );
  const ingest = (server.kvIngest as ServerKvIngestHandle).ingest!;
  let readyAt: number | null = null;
  const pollReady = setInterval(() => {
    if (readyAt !== null) return;
    void fetch(`${server.url}/ready`).then((r) => {
      if (r.ok && readyAt === null) readyAt = performance.now() - s0;
    });
  }, 100);
  const show = setInterval(() => {
    const rep = ingest.syncReport();
    const seqs = records.map((r) => ingest.subscriber(r.id)?.stats.lastSeq ?? -1);
    console.log(
      `  [+${((performance.now() - s0) / 1000).toFixed(1)} s] synced ${rep.synced} syncing ${rep.syncing} unknown ${rep.unknown}; applied seq ${seqs.join(" ")}; load ${load()}`,
    );
  }, 1000);
  await ingest.synced();
  const syncedAt = performance.now() - s0;
  clearInterval(show);
  while (readyAt === null && performance.now() - s0 < syncedAt + 2000)
    await new Promise((r) => setTimeout(r, 50));
  clearInterval(pollReady);
  const rep = ingest.syncReport();
  const subsStats = records.map((r) => ingest.subscriber(r.id)!.stats);
  const resets = subsStats.reduce((a, s) => a + s.resets, 0);
  const rounds = subsStats.map((s) => s.replayRounds);
  const replayed = subsStats.map((s) => s.replayed);
  console.log(`\nresult (load ${load()}):`);
  console.log(`  all ${records.length} ranks done replaying in ${(syncedAt / 1000).toFixed(2)} s`);
  console.log(
    `  per rank ms to synced: ${rep.ranks.map((r) => (r.syncMs === null ? r.state : r.syncMs)).join(", ")}`,
  );
  console.log(`  synced ${rep.synced}, unknown ${rep.unknown}, syncing ${rep.syncing}`);
  console.log(`  ranks reset to empty: ${resets} (goal 0)`);
  console.log(`  batches replayed per rank: ${replayed.join(", ")}; replay rounds: ${rounds.join(", ")}`);
  console.log(
    `  index blocks: ${ingest.index.totalBlocks()}; /ready 200 after ${readyAt === null ? "—" : `${(readyAt / 1000).toFixed(2)} s`}`,
  );
  if (resets > 0 || rep.synced !== records.length) exitCode = 1;
  await server.close();
} finally {
  await fleet.close();
}
process.exit(exitCode);
