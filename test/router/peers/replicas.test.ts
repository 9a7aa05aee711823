/**
 * Routing state shared by real `infera server` processes (src/router/peers): replica A's routed
 * prompt makes replica B route the same prefix to the same worker before any KV event reports
 * it; a dead peer or a killed one only costs misses; an announcement past its TTL no longer
 * counts; a forged, unsigned or replayed one is refused and counted; and the same over a NATS
 * subject with a real nats-server, and with peers found through a real etcd.
 *
 * The engines are sims slowed 200× (`--speed 0.005`): a 2k-token prefill takes ~7 s of wall
 * time, so every decision below is made while the prompts are still queued or prefilling and
 * no BlockStored has been published yet (the control replica, which shares nothing, sees no
 * cached block anywhere at the same moment).
 */
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Publisher, Subscriber } from "zeromq";
import { EtcdRegistrar } from "../../../src/discovery/etcd-registrar.ts";
import { encodeAnnouncement } from "../../../src/router/peers/wire.ts";
import { stopChild } from "../../../src/util/child-process.ts";
import { etcdctl, startEtcd } from "../../helpers/etcd.ts";
import { serverArgs, spawnInfera, waitReadyWorkers } from "../../helpers/infera.ts";
import { startNats } from "../../helpers/nats.ts";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, type SimProcess, simWorkerRecord, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";

const MODEL = "sim-model";
// Both the bridge and the prefix weighted as bench/fleet-routing's kv+pending profile: a prompt
// routed here counts as cached on its worker until it is past its first token.
// promptBudgetMs: the whole prompt is scored even on a loaded box. At the default 100 ms of
// tokenizing a run at load average 25 scored 28 of a prompt's blocks, and "> 100 cached" failed.
const PROFILE = `policy: kv-aware
promptBudgetMs: 5000
profiles:
  mixed:
    scorers:
      - { name: kv-prefix, weight: 2, params: { bridgePending: true } }
      - { name: prefill-backlog, weight: 1 }
    picker: { name: argmin }
`;

let dir = "";
let workersFile = "";
let configFile = "";
const sims: SimProcess[] = [];
const procs: ChildProcess[] = [];
const inflight = new AbortController();

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "infera-peers-"));
  for (let i = 0; i < 2; i++)
    sims.push(await startSim({ model: MODEL, args: ["--speed", "0.005"], timeoutMs: 60_000 }));
  workersFile = join(dir, "workers.json");
  writeFileSync(
    workersFile,
    JSON.stringify(
      sims.map((s, i) => simWorkerRecord(s, { id: `w${i}`, model: MODEL, maxModelLen: 32_768 })),
    ),
  );
  configFile = join(dir, "profile.yaml");
  writeFileSync(configFile, PROFILE);
});

after(async () => {
  inflight.abort();
  await Promise.all(procs.map((p) => stopChild(p)));
  await Promise.all(sims.map((s) => s.stop()));
  rmSync(dir, { recursive: true, force: true });
});

interface Replica {
  url: string;
  proc: ChildProcess;
  output(): string;
}

async function startReplica(
  args: string[],
  env: Record<string, string> = {},
  discovery = ["--discovery", "static", "--workers-file", workersFile],
): Promise<Replica> {
  const port = await freePort();
  const { proc, output } = spawnInfera(serverArgs(port, ...discovery, "--config", configFile, ...args), {
    logLevel: "warn",
    env,
    keepChars: 20_000,
  });
  procs.push(proc);
  const url = `http://127.0.0.1:${port}`;
  // Generous (its default 90 s): the shared 2-core box runs other suites and benches too.
  await waitReadyWorkers(url, proc, output, 2);
  return { url, proc, output };
}

/** Sends a completion and does not wait for it (the sims take seconds); aborted at the end. */
function send(r: Replica, prompt: string): void {
  fetch(`${r.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: 1 }),
    signal: inflight.signal,
  }).then(
    (res) => res.body?.cancel(),
    () => {},
  );
}

interface Decision {
  winner: string;
  candidates: Array<{ worker: string; cachedBlocks: number | null }>;
}

async function decisions(r: Replica): Promise<Decision[]> {
  const res = await fetch(`${r.url}/debug/decisions`);
  return ((await res.json()) as { data: Decision[] }).data;
}

/** Sends `prompt` through `r` and returns its routing decision. */
async function route(r: Replica, prompt: string): Promise<Decision> {
  const before = (await decisions(r)).length;
  send(r, prompt);
  let d: Decision[] = [];
  await waitUntil(
    async () => {
      d = await decisions(r);
      return d.length > before;
    },
    30_000,
    "a routing decision",
  );
  return d[before];
}

const cached = (d: Decision, worker: string) =>
  d.candidates.find((c) => c.worker === worker)?.cachedBlocks ?? 0;

async function metric(r: Replica, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`${r.url}/metrics`)).text();
  return parseMetric(text, name, labels) ?? 0;
}

const waitReceived = (r: Replica, n: number) =>
  waitUntil(
    async () => (await metric(r, "infera_peer_announcements_received_total")) >= n,
    30_000,
    `${n} received`,
    25,
  );

/** ~2k tokens of a tenant's document, then a question. */
const doc = (tenant: string) =>
  Array.from({ length: 220 }, (_, i) => `Tenant ${tenant} manual, section ${i}: item ${i * 7}.`).join(" ");

/** The announcements' TTL in the first tests: long enough for B's decisions on a loaded box. */
const TTL_MS = 8000;

const endpoint = async () => `tcp://127.0.0.1:${await freePort()}`;

let a: Replica;
let b: Replica;

test("replica A's routed prefix makes replica B route it to the same worker before any KV event", async () => {
  const [eA, eB, dead] = await Promise.all([endpoint(), endpoint(), endpoint()]);
  const env = { INFERA_PEERS_TTL_MS: String(TTL_MS) };
  // B also lists a peer that never comes up: it only never hears from it.
  a = await startReplica(["--peers-bind", eA, "--peers", `${eA},${eB}`], env);
  b = await startReplica(["--peers-bind", eB, "--peers", `${eA},${eB},${dead}`], env);
  const control = await startReplica([]);
  // ZMQ's SUB connects asynchronously: a tiny warm-up prompt through A tells when B hears A.
  send(a, "warm-up");
  await waitReceived(b, 1);
  const a1 = await route(a, `${doc("one")} Question: what is item 7?`);
  const a2 = await route(a, `${doc("two")} Question: what is item 14?`);
  assert.notEqual(a1.winner, a2.winner, "A spreads the two tenants (its own backlog)");
  await waitReceived(b, 3);
  const b1 = await route(b, `${doc("one")} Question: what is item 21?`);
  const b2 = await route(b, `${doc("two")} Question: what is item 28?`);
  assert.equal(b1.winner, a1.winner, "B follows A's tenant one");
  assert.equal(b2.winner, a2.winner, "B follows A's tenant two");
  assert.ok(cached(b1, a1.winner) > 100, `B counts tenant one as cached: ${JSON.stringify(b1)}`);
  assert.equal(cached(b1, a2.winner), 0);
  // The control shares nothing: at the same moment no KV event has reported any block yet.
  const c1 = await route(control, `${doc("one")} Question: what is item 35?`);
  assert.deepEqual(
    c1.candidates.map((c) => c.cachedBlocks),
    [0, 0],
  );
  assert.equal(await metric(b, "infera_peer_announcements_dropped_total"), 0);
  assert.ok((await metric(a, "infera_peer_announcements_sent_total")) >= 3);
  assert.ok((await metric(b, "infera_peer_announcements_sent_total")) >= 2);
});

test("an announcement past its TTL no longer counts", async () => {
  const sentBefore = await metric(b, "infera_peer_announcements_received_total");
  const a3 = await route(a, `${doc("three")} Question: what is item 42?`);
  await waitReceived(b, sentBefore + 1);
  const fresh = await route(b, `${doc("three")} Question: what is item 49?`);
  assert.ok(cached(fresh, a3.winner) > 100, "within the TTL it counts");
  await new Promise((r) => setTimeout(r, TTL_MS + 200));
  const late = await route(b, `${doc("three")} Question: what is item 56?`);
  // B's own bridge holds `fresh`'s prompt on its worker; A's announcement on the other is gone.
  const other = late.candidates.find((c) => c.worker !== fresh.winner)!;
  assert.equal(other.cachedBlocks, 0, JSON.stringify(late));
  assert.ok(late.candidates.every((c) => c.cachedBlocks === 0 || c.worker === fresh.winner));
});

test("a peer that dies costs nothing but misses: the other replica keeps serving", async () => {
  a.proc.kill("SIGKILL");
  await new Promise<void>((r) =>
    a.proc.exitCode !== null || a.proc.signalCode ? r() : a.proc.once("exit", () => r()),
  );
  const res = await fetch(`${b.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt: "hello", max_tokens: 1 }),
  });
  assert.equal(res.status, 200, await res.text());
  assert.equal((await fetch(`${b.url}/ready`)).status, 200);
});

test("with a secret: forged, unsigned and replayed announcements are refused and counted", async () => {
  const [eA, eB, eRogue] = await Promise.all([endpoint(), endpoint(), endpoint()]);
  const env = { INFERA_PEERS_SECRET: "s3cret-for-tests" };
  const sa = await startReplica(["--peers-bind", eA, "--peers", `${eA},${eB}`], env);
  // B also follows an endpoint a rogue process holds (a compromised or spoofed peer address).
  const sb = await startReplica(["--peers-bind", eB, "--peers", `${eA},${eB},${eRogue}`], env);
  const rogue = new Publisher({ linger: 0 });
  await rogue.bind(eRogue);
  // The test listens to A too, to capture a genuine signed frame.
  const tap = new Subscriber({ linger: 0 });
  tap.connect(eA);
  tap.subscribe();
  try {
    send(sa, "warm-up");
    await waitReceived(sb, 1);
    const [captured] = await tap.receive();
    const nodes = Float64Array.from({ length: 8 }, (_, i) => i + 1);
    const forged = (secret: Buffer | null, seq: number) =>
      encodeAnnouncement(
        {
          sender: "rogue",
          seq,
          sentAt: Date.now(),
          model: MODEL,
          worker: "w1",
          tokens: 9,
          ttlMs: 60_000,
          nodes,
        },
        secret,
      );
    const until = async (reason: string, n: number) =>
      waitUntil(
        async () => (await metric(sb, "infera_peer_announcements_dropped_total", { reason })) >= n,
        30_000,
        `${n} dropped (${reason})`,
        25,
      );
    // The rogue's SUB peer may need a moment to connect: send until B counts one.
    for (
      let i = 1;
      (await metric(sb, "infera_peer_announcements_dropped_total", { reason: "auth" })) < 1;
      i++
    ) {
      await rogue.send(forged(null, i));
      await new Promise((r) => setTimeout(r, 50));
      assert.ok(i < 200, "B never heard the rogue");
    }
    const auth0 = await metric(sb, "infera_peer_announcements_dropped_total", { reason: "auth" });
    await rogue.send(forged(Buffer.from("wrong secret"), 1000));
    await until("auth", auth0 + 1);
    await rogue.send(captured);
    await until("replay", 1);
    assert.equal(await metric(sb, "infera_peer_announcements_received_total"), 1, "only A's genuine one");
    // A signed announcement from A still works.
    const s1 = await route(sa, `${doc("four")} Question?`);
    await waitReceived(sb, 2);
    const s2 = await route(sb, `${doc("four")} Another question?`);
    assert.equal(s2.winner, s1.winner);
  } finally {
    rogue.close();
    tap.close();
  }
});

test("binding beyond loopback without a secret is refused at start", async () => {
  const port = await freePort();
  const { proc, output } = spawnInfera(
    serverArgs(
      port,
      "--workers-file",
      workersFile,
      "--config",
      configFile,
      "--peers-bind",
      "tcp://0.0.0.0:0",
    ),
    { logLevel: "warn", keepChars: 20_000 },
  );
  procs.push(proc);
  const code = await new Promise<number | null>((r) => proc.once("exit", (c) => r(c)));
  assert.notEqual(code, 0);
  assert.match(output(), /need a shared secret/);
});

test("over NATS: replicas share on infera.route.<model> with a real nats-server", async () => {
  const nats = await startNats();
  try {
    const args = ["--event-plane", "nats", "--nats-url", nats.url, "--request-plane", "http"];
    const na = await startReplica(args);
    const nb = await startReplica(args);
    send(na, "warm-up");
    await waitReceived(nb, 1);
    const n1 = await route(na, `${doc("five")} Question: item 70?`);
    const n2 = await route(na, `${doc("six")} Question: item 77?`);
    assert.notEqual(n1.winner, n2.winner);
    await waitReceived(nb, 3);
    const m1 = await route(nb, `${doc("five")} Question: item 84?`);
    const m2 = await route(nb, `${doc("six")} Question: item 91?`);
    assert.equal(m1.winner, n1.winner);
    assert.equal(m2.winner, n2.winner);
    assert.ok(cached(m1, n1.winner) > 100, JSON.stringify(m1));
    assert.ok(
      (await metric(nb, "infera_peer_announcements_received_total", { transport: "nats" })) >= 3,
      "counted under the nats transport",
    );
    for (const r of [na, nb]) await stopChild(r.proc);
  } finally {
    await nats.close();
  }
});

test("with etcd discovery: replicas find each other's endpoints under <prefix>/peers/ and share", async () => {
  const etcd = await startEtcd();
  const regs: EtcdRegistrar[] = [];
  try {
    for (const [i, s] of sims.entries()) {
      const reg = new EtcdRegistrar({ endpoints: [etcd.endpoint], leaseTtlSeconds: 5 });
      regs.push(reg);
      await reg.register(simWorkerRecord(s, { id: `w${i}`, model: MODEL, maxModelLen: 32_768 }));
    }
    const discovery = ["--discovery", "etcd", "--etcd", etcd.endpoint];
    // No --peers list: only INFERA_PEERS_ENABLED, and each binds any free loopback port.
    const env = { INFERA_PEERS_ENABLED: "true" };
    // No drain on SIGTERM (its requests sit on the slowed sims): close, and revoke, at once.
    const ea = await startReplica(["--drain-timeout", "0"], env, discovery);
    const eb = await startReplica(["--drain-timeout", "0"], env, discovery);
    await waitUntil(
      () =>
        etcdctl(etcd.endpoint, ["get", "--prefix", "--keys-only", "/infera/peers/"]).trim().split(/\s+/)
          .length === 2,
      30_000,
      "two peer keys",
    );
    send(ea, "warm-up");
    await waitReceived(eb, 1);
    const e1 = await route(ea, `${doc("seven")} Question?`);
    await waitReceived(eb, 2);
    const e2 = await route(eb, `${doc("seven")} Another question?`);
    assert.equal(e2.winner, e1.winner);
    assert.ok(cached(e2, e1.winner) > 100, JSON.stringify(e2));
    // A graceful stop revokes the lease: its key goes at once.
    await stopChild(ea.proc);
    await waitUntil(
      () =>
        etcdctl(etcd.endpoint, ["get", "--prefix", "--keys-only", "/infera/peers/"])
          .trim()
          .split(/\s+/)
          .filter(Boolean).length === 1,
      30_000,
      "the stopped replica's key gone",
    );
    await stopChild(eb.proc);
  } finally {
    for (const r of regs) await r.close().catch(() => {});
    await etcd.dispose();
  }
});
