/**
 * Issue #17: a worker killed with -9 and removed from discovery at once (a crash seen by the
 * discovery backend) while the server has requests queued on its connection pool. Before the
 * fix, the removal destroyed the pool and every queued request failed with
 * UND_ERR_DESTROYED, a 502 no router retried (3–4 per run in the issue). Now the pool is
 * closed, not destroyed, and a request its pool never sent is retryable: the queued requests
 * go to the dead worker, are refused and are retried on the others. Streams that were in
 * flight on the victim end with a clean error event (they cannot be retried).
 *
 * Two connections per worker, so that requests queue on each pool under the load.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { simRecord } from "../server/cluster.ts";
import { metricSum, newCounts, runLoad, sleep } from "./load.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
process.env.INFERA_LOG_LEVEL ??= "silent";

let server: InferaServer | undefined;
const sims: SimProcess[] = [];
after(async () => {
  await server?.close();
  await Promise.all(sims.map((s) => s.stop()));
  fileDone(import.meta.url);
});

test("kill -9 + removal with requests queued on the pool: none lost", { timeout: 60_000 }, async () => {
  sims.push(...(await Promise.all([0, 1, 2].map(() => startSim({ args: ["--speed", "1", "--seed", "1"] })))));
  const memory = new MemoryDiscovery(sims.map((sim, i) => simRecord(sim, i)));
  server = await startServer(
    { port: 0, scrapeIntervalMs: 0, upstream: { connections: 2 } },
    { discovery: memory },
  );
  const s = server;
  const victim = s.workers.get("sim-1")!;
  const counts = newCounts();
  let stop = false;
  const load = runLoad({
    baseUrl: s.url,
    model: "sim-model",
    concurrency: 24,
    stop: () => stop,
    streamMaxTokens: 200,
    wholeMaxTokens: 40,
    counts,
  });
  await sleep(800);
  // Two on the victim's connections, the rest queued on its pool.
  const deadline = Date.now() + 10_000;
  while (victim.inFlight < 5 && Date.now() < deadline) await sleep(5);
  const queuedAtKill = victim.inFlight - 2;
  // In one tick, as when a discovery backend reports the crash: no socket event of the kill
  // has been seen yet when the pool goes.
  process.kill(sims[1]!.pid, "SIGKILL");
  memory.remove("sim-1");
  await sleep(2500);
  stop = true;
  await load;
  const retried = metricSum(await (await fetch(`${s.url}/metrics`)).text(), "infera_retries_total");

  const pass = counts.lost === 0 && counts.streamErrorsDirty === 0 && queuedAtKill >= 1;
  record(
    import.meta.url,
    "kill -9 + removal, requests queued on the pool (http)",
    `${counts.sent} requests, ~${queuedAtKill} queued on the victim's pool at the kill: lost ${counts.lost}, ` +
      `retried ${retried}, failed streams ${counts.streamErrorsClean} (clean), cut ${counts.streamErrorsDirty}`,
    "lost = 0, cut = 0",
    pass,
  );
  assert.ok(queuedAtKill >= 1, `requests were queued on the pool (${victim.inFlight} in flight)`);
  assert.equal(counts.lost, 0, `lost requests: ${counts.samples.join("; ")}`);
  assert.equal(counts.streamErrorsDirty, 0, `cut streams: ${counts.samples.join("; ")}`);
  assert.ok(retried >= 1, "the queued requests were retried on the other workers");
});
