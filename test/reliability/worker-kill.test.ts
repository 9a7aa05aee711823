/**
 * A worker killed with -9 under load (3 sims behind infera server, 32 closed-loop clients,
 * half streamed): no request that had not started streaming is lost (it is retried on
 * another worker), every stream that was in flight on the dead worker ends with an
 * OpenAI-shaped error event and `[DONE]`, and the worker is out of rotation ≤ 1 s after the
 * kill (its first refused connection opens the breaker).
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { type Cluster, startCluster } from "../server/cluster.ts";
import { metricSum, newCounts, runLoad, sleep } from "./load.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
process.env.INFERA_LOG_LEVEL ??= "silent";

let c: Cluster | undefined;
after(async () => {
  await c?.close();
  fileDone(import.meta.url);
});

test("kill -9 of a worker under load: 0 lost, clean stream errors, out of rotation ≤ 1 s", {
  timeout: 60_000,
}, async () => {
  // Real-time sims: a 300-token stream lasts ~1-2 s under this load, so several are always
  // in flight on each worker when one dies.
  c = await startCluster(3, {
    simArgs: ["--speed", "1", "--seed", "1"],
    config: { breaker: { cooldownMs: 60_000, maxCooldownMs: 60_000 } },
  });
  const cluster = c;
  const victim = cluster.server.workers.get("sim-1")!;
  const counts = newCounts();
  let stop = false;
  const load = runLoad({
    baseUrl: cluster.server.url,
    model: "sim-model",
    concurrency: 32,
    stop: () => stop,
    streamMaxTokens: 300,
    wholeMaxTokens: 60,
    counts,
  });
  // Let the load settle until the victim has work in flight.
  await sleep(1200);
  const deadline = Date.now() + 5000;
  while (victim.inFlight < 3 && Date.now() < deadline) await sleep(10);
  const inFlightAtKill = victim.inFlight;
  const killedAt = performance.now();
  process.kill(cluster.sims[1]!.pid, "SIGKILL");
  let leftMs = Number.NaN;
  while (performance.now() - killedAt < 5000) {
    if (!victim.available) {
      leftMs = performance.now() - killedAt;
      break;
    }
    await sleep(2);
  }
  await sleep(2500);
  stop = true;
  await load;
  const metrics = await (await fetch(`${cluster.server.url}/metrics`)).text();
  const retried = metricSum(metrics, "infera_retries_total");

  const figure =
    `${counts.sent} requests (32 in flight), ${inFlightAtKill} on the victim at the kill: ` +
    `lost ${counts.lost}, retried ${retried}, failed streams ${counts.streamErrorsClean} (clean error + [DONE]), ` +
    `cut streams ${counts.streamErrorsDirty}; out of rotation ${leftMs.toFixed(0)} ms after kill -9`;
  const pass =
    counts.lost === 0 &&
    counts.streamErrorsDirty === 0 &&
    counts.streamErrorsClean >= 1 &&
    retried >= 1 &&
    leftMs <= 1000;
  record(
    import.meta.url,
    "worker kill -9 (http, memory discovery)",
    figure,
    "lost = 0, cut = 0, failed streams end clean, out of rotation ≤ 1000 ms",
    pass,
  );
  assert.equal(counts.lost, 0, `lost requests: ${counts.samples.join("; ")}`);
  assert.equal(
    counts.streamErrorsDirty,
    0,
    `streams cut without error + [DONE]: ${counts.samples.join("; ")}`,
  );
  assert.ok(
    counts.streamErrorsClean >= 1,
    "a stream was in flight on the victim and ended with an error event",
  );
  assert.ok(retried >= 1, "requests sent to the dead worker were retried elsewhere");
  assert.ok(leftMs <= 1000, `out of rotation after ${leftMs} ms`);
  assert.equal(victim.available, false);
});
