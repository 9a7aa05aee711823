/**
 * One engine scrape shared among real `infera server` replicas (issue #32, src/router/peers/
 * load-share.ts): three replicas on a signed ZMQ peer mesh over two sims. Each sim sits behind a small
 * counting proxy (the worker records name the proxy), so the `/metrics` requests are counted
 * at the engine's side, not by the replicas: together they come at about one replica's rate;
 * every replica still holds a fresh `engineLoad` for every worker (GET /v1/workers), a request
 * in flight on one replica shows in the others' load; killing a replica that scrapes makes
 * another take its workers over within a bounded time. Then the same over NATS (two replicas,
 * a real nats-server), and `INFERA_PEERS_SHARE_LOAD=false` as today: every replica scrapes.
 *
 * Scrape pace 200 ms, idle pace the same (`--scrape-idle-interval 0`), so one replica alone
 * requests each engine's /metrics 5 times a second.
 */
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { stopChild } from "../../../src/util/child-process.ts";
import { serverArgs, spawnInfera, waitReadyWorkers } from "../../helpers/infera.ts";
import { startNats } from "../../helpers/nats.ts";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, type SimProcess, simWorkerRecord, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";

const MODEL = "sim-model";
const INTERVAL_MS = 200;
/** /metrics requests per second per engine from one replica alone. */
const ONE_REPLICA_RATE = 1000 / INTERVAL_MS;
// Only the engines' load decides (least-load reads engineLoad): the scraper runs, and with a
// peer plane it shares.
const PROFILE = `policy: round-robin
profiles:
  mixed:
    scorers: []
    picker: { name: least-load }
`;

interface Proxy {
  url: string;
  /** When each GET …/metrics came (ms since the epoch). */
  hits: number[];
  server: Server;
}

/** Forwards everything to `target`, counting the /metrics requests. */
async function countingProxy(target: string): Promise<Proxy> {
  const hits: number[] = [];
  const server = createServer((req, res) => {
    if (req.method === "GET" && (req.url ?? "").endsWith("/metrics")) hits.push(Date.now());
    const up = request(`${target}${req.url}`, { method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits, server };
}

let dir = "";
let workersFile = "";
let configFile = "";
const sims: SimProcess[] = [];
const proxies: Proxy[] = [];
const procs: ChildProcess[] = [];
const inflight = new AbortController();

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "infera-shared-scrape-"));
  for (let i = 0; i < 2; i++) {
    const sim = await startSim({ model: MODEL, args: ["--speed", "0.005"], timeoutMs: 60_000 });
    sims.push(sim);
    proxies.push(await countingProxy(sim.url));
  }
  workersFile = join(dir, "workers.json");
  const records = sims.map((s, i) => ({
    ...simWorkerRecord(s, { id: `w${i}`, model: MODEL, maxModelLen: 32_768 }),
    url: proxies[i].url,
  }));
  writeFileSync(workersFile, JSON.stringify(records));
  configFile = join(dir, "profile.yaml");
  writeFileSync(configFile, PROFILE);
});

after(async () => {
  inflight.abort();
  await Promise.all(procs.map((p) => stopChild(p)));
  await Promise.all(sims.map((s) => s.stop()));
  for (const p of proxies) {
    p.server.closeAllConnections();
    p.server.close();
  }
  rmSync(dir, { recursive: true, force: true });
});

interface Replica {
  url: string;
  proc: ChildProcess;
}

async function startReplica(args: string[], env: Record<string, string> = {}): Promise<Replica> {
  const port = await freePort();
  const scrape = ["--scrape-interval", String(INTERVAL_MS), "--scrape-idle-interval", "0"];
  const { proc, output } = spawnInfera(
    serverArgs(
      port,
      "--discovery",
      "static",
      "--workers-file",
      workersFile,
      "--config",
      configFile,
      ...scrape,
      ...args,
    ),
    { logLevel: "warn", env, keepChars: 20_000 },
  );
  procs.push(proc);
  const url = `http://127.0.0.1:${port}`;
  await waitReadyWorkers(url, proc, output, 2);
  return { url, proc };
}

async function stop(rs: Replica[]): Promise<void> {
  await Promise.all(rs.map((r) => stopChild(r.proc)));
}

interface WorkerView {
  id: string;
  state: { engineLoad: { running: number; waiting: number; scrapedAt: number } | null };
}

async function workers(r: Replica): Promise<WorkerView[]> {
  return ((await (await fetch(`${r.url}/v1/workers`)).json()) as { data: WorkerView[] }).data;
}

/**
 * A reading younger than this is fresh: a 200 ms pace gives ~400 ms, with room for a loaded box;
 * a replica that heard nothing since its start-up scrape holds one many seconds old.
 */
const FRESH_MS = 3000;

/** The oldest engine reading a replica holds, in ms (Infinity: a worker without one). */
async function oldestReading(r: Replica): Promise<number> {
  const now = Date.now();
  return Math.max(
    ...(await workers(r)).map((w) => (w.state.engineLoad ? now - w.state.engineLoad.scrapedAt : Infinity)),
  );
}

async function metric(r: Replica, name: string): Promise<number> {
  return parseMetric(await (await fetch(`${r.url}/metrics`)).text(), name, {}) ?? 0;
}

/** /metrics requests per second per engine, both engines together, over the last `ms`. */
function rate(ms: number, until = Date.now()): number {
  const from = until - ms;
  const n = proxies.reduce((s, p) => s + p.hits.filter((t) => t > from && t <= until).length, 0);
  return (n * 1000) / ms / proxies.length;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const endpoint = async () => `tcp://127.0.0.1:${await freePort()}`;

/** Waits until the engines see about one replica's scrape rate (the replicas heard each other). */
async function settle(what: string): Promise<void> {
  await waitUntil(
    async () => rate(1000) <= 1.5 * ONE_REPLICA_RATE,
    30_000,
    `${what}: one replica's scrape rate`,
    250,
  );
}

test("three replicas on a signed ZMQ mesh: one replica's scrape rate at the engines, fresh load everywhere, the owner's death taken over", async () => {
  const eps = await Promise.all([endpoint(), endpoint(), endpoint()]);
  const list = eps.join(",");
  const rs: Replica[] = [];
  // Signed frames (HMAC-SHA256 under the shared secret), as a mesh beyond loopback must be.
  const env = { INFERA_PEERS_SECRET: "shared-scrape-test-secret" };
  for (const e of eps) rs.push(await startReplica(["--peers-bind", e, "--peers", list], env));
  try {
    await settle("3 replicas");
    await sleep(3000);
    const measured = rate(3000);
    assert.ok(
      // The floor is loose: on a loaded box the 200 ms timers slip, and only "still scraped" counts.
      measured <= 1.5 * ONE_REPLICA_RATE && measured >= 0.3 * ONE_REPLICA_RATE,
      `engines scraped ${measured.toFixed(1)}/s each, one replica alone: ${ONE_REPLICA_RATE}/s (3 unshared: ${3 * ONE_REPLICA_RATE})`,
    );
    for (const r of rs) {
      const age = await oldestReading(r);
      assert.ok(age < FRESH_MS, `${r.url} holds a reading ${age} ms old`);
    }
    // Who scrapes: some replicas, and the others file peers' readings.
    const scrapes = await Promise.all(rs.map((r) => metric(r, "infera_engine_scrapes_total")));
    const filed = await Promise.all(rs.map((r) => metric(r, "infera_engine_load_peer_readings_total")));
    assert.ok(filed.filter((n) => n > 0).length >= 2, `replicas filing peers' readings: ${filed.join(", ")}`);

    // A request in flight through replica 0 shows in every replica's load of its worker,
    // whoever scrapes it (the sims are slowed: its prefill takes seconds).
    const prompt = Array.from({ length: 200 }, (_, i) => `Section ${i}: item ${i * 3}.`).join(" ");
    void fetch(`${rs[0].url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, prompt, max_tokens: 1 }),
      signal: inflight.signal,
    }).then(
      (res) => res.body?.cancel(),
      () => {},
    );
    for (const r of rs)
      await waitUntil(
        async () =>
          (await workers(r)).some(
            (w) => (w.state.engineLoad?.running ?? 0) + (w.state.engineLoad?.waiting ?? 0) > 0,
          ),
        15_000,
        `${r.url} sees the request in an engine's load`,
        50,
      );

    // Kill (SIGKILL: no goodbye) a replica that scrapes; the others take its workers over.
    const before = await Promise.all(rs.map((r) => metric(r, "infera_engine_scrapes_total")));
    await sleep(1000);
    const after1 = await Promise.all(rs.map((r) => metric(r, "infera_engine_scrapes_total")));
    const owner = rs.findIndex((_, i) => after1[i] > before[i]);
    assert.ok(owner >= 0, `someone scrapes: ${JSON.stringify({ scrapes, after1 })}`);
    const killedAt = Date.now();
    rs[owner].proc.kill("SIGKILL");
    await new Promise((r) => rs[owner].proc.once("exit", r));
    await sleep(4000);
    // Per engine, the longest gap between two /metrics requests since the kill.
    for (const [i, p] of proxies.entries()) {
      const ts = [killedAt, ...p.hits.filter((t) => t > killedAt)];
      let gap = 0;
      for (let k = 1; k < ts.length; k++) gap = Math.max(gap, ts[k] - ts[k - 1]);
      gap = Math.max(gap, Date.now() - ts[ts.length - 1]);
      // The live window (3 periods) + a tick + the scrape, with room for a loaded box.
      assert.ok(gap < 3000, `engine ${i} went ${gap} ms without a scrape after the owner died`);
    }
    const rest = rs.filter((_, i) => i !== owner);
    for (const r of rest) {
      const age = await oldestReading(r);
      assert.ok(age < FRESH_MS, `${r.url} holds a reading ${age} ms old after the takeover`);
    }
    const afterKill = rate(2000);
    assert.ok(afterKill <= 1.5 * ONE_REPLICA_RATE, `after the takeover: ${afterKill.toFixed(1)}/s each`);
  } finally {
    await stop(rs);
  }
});

test("over NATS: two replicas share one scrape; INFERA_PEERS_SHARE_LOAD=false scrapes as today", async () => {
  const nats = await startNats();
  try {
    const args = ["--event-plane", "nats", "--nats-url", nats.url, "--request-plane", "http"];
    const rs = [await startReplica(args), await startReplica(args)];
    let shared = 0;
    try {
      await settle("2 replicas over NATS");
      await sleep(2000);
      shared = rate(2000);
      assert.ok(shared <= 1.5 * ONE_REPLICA_RATE, `shared over NATS: ${shared.toFixed(1)}/s each`);
      for (const r of rs) assert.ok((await oldestReading(r)) < FRESH_MS);
      const filed = await Promise.all(rs.map((r) => metric(r, "infera_engine_load_peer_readings_total")));
      assert.ok(
        filed.some((n) => n > 0),
        `a replica files the other's readings: ${filed.join(", ")}`,
      );
    } finally {
      await stop(rs);
    }
    // The switch off: each replica scrapes every engine itself (today's behaviour).
    const off = { INFERA_PEERS_SHARE_LOAD: "false" };
    const us = [await startReplica(args, off), await startReplica(args, off)];
    try {
      await sleep(3000);
      const unshared = rate(2000);
      // Against the shared rate of the same test (timers slip alike on a loaded box): ~2×.
      assert.ok(
        unshared >= 1.4 * shared,
        `not shared: ${unshared.toFixed(1)}/s each, shared ${shared.toFixed(1)}`,
      );
      for (const r of us) assert.equal(await metric(r, "infera_engine_load_peer_readings_total"), 0);
    } finally {
      await stop(us);
    }
  } finally {
    await nats.close();
  }
});
