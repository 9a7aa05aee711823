/**
 * NATS restarted under load with the NATS request plane: 2 sims, each behind a request agent,
 * infera server publishing to the agents' subjects, 16 closed-loop clients. The broker is
 * restarted (SIGTERM, start again on the same port).
 *
 * Goal (issue #17 item 11): no request that was not yet streaming fails — one sent while the
 * broker is away waits for the reconnect, one caught before its response head is sent again —
 * and a stream already under way when the broker goes ends with a clean error event + [DONE]
 * (its frames may be lost with the broker). Once the plane answers again, 0 failed.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { type NatsRequestAgent, startRequestAgent } from "../../src/transport/nats/agent.ts";
import { connectNats } from "../../src/transport/nats/connection.ts";
import { type NatsServerHandle, startNats } from "../helpers/nats.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { simRecord } from "../server/cluster.ts";
import { failures, newCounts, runLoad, sleep } from "./load.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
process.env.INFERA_LOG_LEVEL ??= "silent";

let nats: NatsServerHandle | undefined;
let server: InferaServer | undefined;
const sims: SimProcess[] = [];
const agents: NatsRequestAgent[] = [];
const conns: NatsConnection[] = [];
after(async () => {
  await server?.close();
  for (const a of agents) await a.close().catch(() => {});
  for (const nc of conns) await nc.close().catch(() => {});
  await Promise.all(sims.map((s) => s.stop()));
  await nats?.close();
  fileDone(import.meta.url);
});

async function probe(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "sim-model", prompt: "probe", max_tokens: 2 }),
      signal: AbortSignal.timeout(2000),
    });
    await res.arrayBuffer();
    return res.status === 200;
  } catch {
    return false;
  }
}

test("NATS restarted under load: 0 failed of requests not yet streaming", { timeout: 60_000 }, async () => {
  nats = await startNats();
  const n = nats;
  sims.push(...(await Promise.all([0, 1].map(() => startSim({ args: ["--speed", "2", "--seed", "1"] })))));
  const records = [];
  for (const [i, sim] of sims.entries()) {
    const nc = await connectNats({ url: n.url, name: `agent-${i}` });
    conns.push(nc);
    const rec = simRecord(sim, i);
    const agent = await startRequestAgent({ nc, engineUrl: sim.url, model: rec.model, workerId: rec.id });
    agents.push(agent);
    records.push({ ...rec, natsSubject: agent.subject });
  }
  server = await startServer(
    { port: 0, scrapeIntervalMs: 0, requestPlane: "nats", nats: { url: n.url } },
    { discovery: new MemoryDiscovery(records) },
  );
  const s = server;
  assert.ok(await probe(s.url), "the NATS plane serves before the restart");

  const phases = { before: newCounts(), restart: newCounts(), after: newCounts() };
  // Finished before the restart began / started once the plane answered again / the rest
  // (in flight at the restart, or sent while the broker was away).
  let restartAt = Number.POSITIVE_INFINITY;
  let backAt = Number.POSITIVE_INFINITY;
  let stop = false;
  const load = runLoad({
    baseUrl: s.url,
    model: "sim-model",
    concurrency: 16,
    stop: () => stop,
    streamMaxTokens: 60,
    wholeMaxTokens: 30,
    bucket: (started, ended) =>
      ended < restartAt ? phases.before : started >= backAt ? phases.after : phases.restart,
  });
  await sleep(2000);
  restartAt = performance.now();
  await n.restart();
  let reconnectMs = Number.NaN;
  const deadline = performance.now() + 15_000;
  while (performance.now() < deadline) {
    // Back = every worker in rotation again (breakers closed) and a request goes through.
    if (s.workers.list().every((w) => w.available) && (await probe(s.url))) {
      backAt = performance.now();
      reconnectMs = backAt - restartAt;
      break;
    }
    await sleep(50);
  }
  if (!Number.isFinite(backAt)) backAt = performance.now();
  await sleep(4000);
  stop = true;
  await load;

  const f = {
    before: failures(phases.before),
    restart: failures(phases.restart),
    after: failures(phases.after),
  };
  const all = [phases.before, phases.restart, phases.after];
  const sum = (k: "sent" | "lost" | "streamErrorsClean" | "streamErrorsDirty") =>
    all.reduce((n, c) => n + c[k], 0);
  // Lost: failed before any content reached the client (not yet streaming). Clean: a stream
  // under way when the broker went, ended with an error event + [DONE]. Cut: ended otherwise.
  const lost = sum("lost");
  const clean = sum("streamErrorsClean");
  const cut = sum("streamErrorsDirty");
  const samples = all.flatMap((c) => c.samples);
  const figure =
    `${sum("sent")} requests: not yet streaming failed ${lost}; streams under way at the restart ` +
    `${clean} ended with an error event + [DONE], ${cut} cut; failed ${f.before}/${phases.before.sent} before, ` +
    `${f.restart}/${phases.restart.sent} around the restart (in flight or sent while the broker was away), ` +
    `${f.after}/${phases.after.sent} after reconnect; plane back ${reconnectMs.toFixed(0)} ms after the restart began`;
  const pass =
    lost === 0 &&
    cut === 0 &&
    f.before === 0 &&
    f.after === 0 &&
    phases.restart.sent > 0 &&
    phases.after.sent > 0 &&
    Number.isFinite(reconnectMs);
  record(
    import.meta.url,
    "NATS restart under load (nats request plane)",
    figure,
    "0 failed of requests not yet streaming, streams under way end with error + [DONE] (0 cut), 0 failed after reconnect",
    pass,
  );
  assert.ok(Number.isFinite(reconnectMs), "the NATS plane answered again after the restart");
  assert.equal(lost, 0, `${figure}: ${samples.join("; ")}`);
  assert.equal(cut, 0, `${figure}: ${samples.join("; ")}`);
  assert.equal(f.before, 0, phases.before.samples.join("; "));
  assert.equal(f.after, 0, `${figure}: ${phases.after.samples.join("; ")}`);
  assert.ok(phases.restart.sent > 0, "requests were in flight or sent around the restart");
  assert.ok(phases.after.sent > 0);
});
