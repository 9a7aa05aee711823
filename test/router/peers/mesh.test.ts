/**
 * The peer plane's pieces in one process: the digest keeps prefix matching, the table's TTL and
 * bounds, the wire's signature, and the mesh's checks (own frames, replay, stale, auth, full),
 * with its metrics. The transport here is a plain in-memory one; the real ZMQ mesh between
 * server processes is test/router/peers/replicas.test.ts.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Registry } from "prom-client";
import { ApproxPrefixTree } from "../../../src/kv/approx-tree.ts";
import { PeerMesh } from "../../../src/router/peers/mesh.ts";
import { digest, digestDense, PeerTable } from "../../../src/router/peers/table.ts";
import type { PeerTransport } from "../../../src/router/peers/types.ts";
import { decodeAnnouncement, encodeAnnouncement } from "../../../src/router/peers/wire.ts";
import { isLoopbackEndpoint } from "../../../src/server/peer-plane.ts";
import { createLogger } from "../../../src/util/log.ts";

const logger = createLogger("test");
logger.level = "silent";

const tree = new ApproxPrefixTree({ chunkChars: 64, maxNodesPerWorker: 1000 });
const words = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag} word ${i}.`).join(" ");

test("digest: a capped sample still tells how far a prompt shares the announced prefix", () => {
  const long = words("doc", 3000); // ~38k chars, ~600 nodes
  const path = tree.path(long);
  assert.ok(path.length > 500);
  const d = digest(path, 64);
  assert.equal(d.length, 64);
  assert.equal(d[63], path[path.length - 1], "the last node is always kept");
  // With the dense head declared, a miss there ends the match at once; the answers are the same.
  const t = new PeerTable({
    maxEntriesPerWorker: 10,
    maxEntries: 100,
    now: () => 0,
    denseNodes: digestDense(64),
  });
  t.add("w", d, 1000);
  assert.equal(t.match("w", path), path.length, "the whole prompt");
  // A prompt that shares the first 20 000 chars and then differs.
  const other = tree.path(`${long.slice(0, 20_000)} something else entirely ${words("x", 50)}`);
  const m = t.match("w", other);
  const shared = Math.floor(20_000 / 64);
  assert.ok(m <= shared && m >= shared - Math.ceil((path.length - 32) / 31) - 1, `match ${m} vs ${shared}`);
  assert.equal(t.match("w", tree.path(words("unrelated", 100))), 0);
  // Shares only the first 10 nodes (640 chars), inside the dense head: exactly 10.
  assert.equal(t.match("w", tree.path(`${long.slice(0, 640)}#${words("y", 300)}`)), 10);
  assert.equal(t.match("v", path), 0, "another worker");
  assert.deepEqual(Array.from(digest([1, 2, 3], 8)), [1, 2, 3], "short paths go whole");
});

test("PeerTable: entries leave at their TTL; per-worker and total caps", () => {
  let now = 0;
  const t = new PeerTable({ maxEntriesPerWorker: 2, maxEntries: 3, now: () => now });
  assert.equal(t.add("a", Float64Array.of(1, 2), 100), 0);
  assert.equal(t.add("a", Float64Array.of(1, 3), 200), 0);
  assert.equal(t.match("a", [1, 2]), 2);
  assert.equal(t.add("a", Float64Array.of(1, 4), 300), 1, "the oldest of a full worker leaves");
  assert.equal(t.match("a", [1, 2]), 1, "node 2 left with its entry; node 1 is still held");
  assert.equal(t.add("b", Float64Array.of(9), 300), 0);
  assert.equal(t.add("c", Float64Array.of(8), 300), 1, "total full: a new worker's entry is refused");
  assert.equal(t.size(), 3);
  now = 250;
  assert.equal(t.add("c", Float64Array.of(8), 300), 0, "expired entries made room");
  assert.equal(t.match("a", [5, 3]), 0, "expired at 200");
  assert.equal(t.match("a", [1, 3]), 1, "node 1 is still held by the third");
  assert.equal(t.match("a", [1, 4]), 2);
  now = 300;
  assert.equal(t.match("a", [1, 4]), 0);
  t.removeWorker("b");
  assert.equal(t.match("b", [9]), 0);
});

test("wire: signed frames verify only under the same secret; unsigned only without one", () => {
  const a = {
    sender: "r1",
    seq: 7,
    sentAt: 123,
    model: "m",
    worker: "w",
    tokens: 10,
    ttlMs: 1000,
    nodes: Float64Array.of(2 ** 52 - 1, 5),
  };
  const s1 = Buffer.from("one");
  const signed = encodeAnnouncement(a, s1);
  const d = decodeAnnouncement(signed, s1);
  assert.ok(d.ok);
  assert.deepEqual(Array.from(d.a.nodes), [2 ** 52 - 1, 5], "52-bit nodes exact");
  assert.equal(d.a.seq, 7);
  assert.deepEqual(decodeAnnouncement(signed, Buffer.from("two")), { ok: false, reason: "auth" });
  assert.deepEqual(decodeAnnouncement(signed, null), { ok: false, reason: "auth" });
  const plain = encodeAnnouncement(a, null);
  assert.ok(decodeAnnouncement(plain, null).ok);
  assert.deepEqual(
    decodeAnnouncement(plain, s1),
    { ok: false, reason: "auth" },
    "unsigned refused with a secret",
  );
  const tampered = Buffer.from(signed);
  tampered[10] ^= 1;
  assert.deepEqual(decodeAnnouncement(tampered, s1), { ok: false, reason: "auth" });
  assert.deepEqual(decodeAnnouncement(Buffer.of(1, 0xc1), null), { ok: false, reason: "malformed" });
  assert.deepEqual(decodeAnnouncement(Buffer.of(1), null), { ok: false, reason: "malformed" });
});

/** Frames published by one mesh arrive at every other on the same bus. */
class Bus {
  readonly members: PeerMesh[] = [];
  transport(): PeerTransport {
    return {
      kind: "zmq",
      endpoint: "bus",
      publish: (_model, frame) => {
        for (const m of this.members) m.receive(frame);
      },
      frames: async function* () {},
      close: async () => {},
    };
  }
}

async function metric(reg: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = await reg.getSingleMetric(name)?.get();
  let sum = 0;
  for (const v of m?.values ?? []) {
    if ((v as { metricName?: string }).metricName?.endsWith("_bucket")) continue;
    if (Object.entries(labels).every(([k, x]) => (v.labels as Record<string, string>)[k] === x))
      sum += v.value;
  }
  return sum;
}

/** A mesh member on `bus` (16-node digests, 4 entries a worker, 8 in all) with its own registry. */
function member(bus: Bus, id: string, secret: string | null, ttlMs: number, now: () => number) {
  const registry = new Registry();
  const m = new PeerMesh({
    transport: bus.transport(),
    secret: secret === null ? null : Buffer.from(secret),
    ttlMs,
    maxNodes: 16,
    maxEntriesPerWorker: 4,
    maxEntries: 8,
    registry,
    logger,
    replicaId: id,
    now,
  });
  bus.members.push(m);
  return { m, registry };
}

test("PeerMesh: a peer's announcement counts on its worker for its TTL; own, replayed, stale, forged are not taken", async () => {
  let now = 10_000;
  const bus = new Bus();
  const mk = (id: string, secret: string | null, ttlMs = 1000) => member(bus, id, secret, ttlMs, () => now);
  const a = mk("a", "s");
  const b = mk("b", "s");
  const rogue = mk("rogue", "wrong");
  const path = tree.path(words("tenant", 200));
  a.m.forModel("m").announce("w1", path, 500);
  assert.equal(b.m.forModel("m").match("w1", path), path.length);
  assert.equal(b.m.forModel("m").match("w2", path), 0);
  assert.equal(b.m.forModel("other").match("w1", path), 0, "per model");
  assert.equal(a.m.forModel("m").match("w1", path), 0, "own announcements are skipped");
  assert.equal(await metric(a.registry, "infera_peer_announcements_sent_total"), 1);
  assert.equal(await metric(b.registry, "infera_peer_announcements_received_total"), 1);
  // The rogue signs with another secret: refused by a and b, counted as auth.
  rogue.m.forModel("m").announce("w2", path, 500);
  assert.equal(b.m.forModel("m").match("w2", path), 0);
  assert.equal(await metric(b.registry, "infera_peer_announcements_dropped_total", { reason: "auth" }), 1);
  // A captured frame sent again: replay.
  const first = encodeAnnouncement(
    {
      sender: "x",
      seq: 1,
      sentAt: now,
      model: "m",
      worker: "w0",
      tokens: 1,
      ttlMs: 1000,
      nodes: Float64Array.of(path[0]),
    },
    Buffer.from("s"),
  );
  b.m.receive(first);
  assert.equal(b.m.forModel("m").match("w0", path), 1);
  const frame = encodeAnnouncement(
    {
      sender: "x",
      seq: 1,
      sentAt: now,
      model: "m",
      worker: "w3",
      tokens: 1,
      ttlMs: 1000,
      nodes: Float64Array.of(path[0]),
    },
    Buffer.from("s"),
  );
  b.m.receive(frame);
  assert.equal(await metric(b.registry, "infera_peer_announcements_dropped_total", { reason: "replay" }), 1);
  assert.equal(b.m.forModel("m").match("w3", path), 0);
  // A late one (sent longer ago than its TTL): stale.
  const late = encodeAnnouncement(
    {
      sender: "x",
      seq: 99,
      sentAt: now - 1500,
      model: "m",
      worker: "w3",
      tokens: 1,
      ttlMs: 1000,
      nodes: Float64Array.of(path[0]),
    },
    Buffer.from("s"),
  );
  b.m.receive(late);
  assert.equal(await metric(b.registry, "infera_peer_announcements_dropped_total", { reason: "stale" }), 1);
  // A peer's TTL longer than ours is cut to ours.
  const long = encodeAnnouncement(
    {
      sender: "x",
      seq: 100,
      sentAt: now,
      model: "m",
      worker: "w4",
      tokens: 1,
      ttlMs: 1e9,
      nodes: Float64Array.of(path[0]),
    },
    Buffer.from("s"),
  );
  b.m.receive(long);
  assert.equal(b.m.forModel("m").match("w4", path), 1);
  now += 1000;
  assert.equal(b.m.forModel("m").match("w1", path), 0, "TTL over");
  assert.equal(b.m.forModel("m").match("w4", path), 0, "our TTL, not the peer's");
  // Full: the per-worker cap pushes the oldest out and counts it.
  for (let i = 0; i < 5; i++) a.m.forModel("m").announce("w5", tree.path(words(`t${i}`, 50)), 10);
  assert.equal(b.m.table("m")?.size("w5"), 4);
  assert.equal(await metric(b.registry, "infera_peer_announcements_dropped_total", { reason: "full" }), 1);
  const hist = await b.registry.getSingleMetric("infera_peer_announcement_age_seconds")?.get();
  const age =
    hist?.values.find((v) => (v as { metricName?: string }).metricName?.endsWith("_count"))?.value ?? 0;
  assert.ok(age >= 7, `age observations ${age}`);
});

test("isLoopbackEndpoint", () => {
  for (const e of [
    "tcp://127.0.0.1:7300",
    "tcp://localhost:*",
    "tcp://[::1]:1",
    "ipc:///tmp/x",
    "tcp://127.1.2.3:0",
  ])
    assert.ok(isLoopbackEndpoint(e), e);
  for (const e of [
    "tcp://0.0.0.0:7300",
    "tcp://10.0.0.2:7300",
    "tcp://*:7300",
    "tcp://host:1",
    "tcp://eth0;127.0.0.1:1",
  ])
    assert.ok(!isLoopbackEndpoint(e), e);
});

test("PeerMesh: a retraction takes the peer's entry out before its TTL; a forged one cannot", async () => {
  const bus = new Bus();
  const mk = (id: string, secret: string) => member(bus, id, secret, 60_000, () => 10_000);
  const a = mk("a", "s");
  const b = mk("b", "s");
  const rogue = mk("rogue", "wrong");
  const path = tree.path(words("retract", 200));
  const other = tree.path(words("another", 200));
  a.m.forModel("m").announce("w1", path, 500);
  a.m.forModel("m").announce("w1", other, 500);
  assert.equal(b.m.forModel("m").match("w1", path), path.length);
  // Only a's own key can retract: the rogue's frame is refused (auth), the entry stays.
  rogue.m.forModel("m").retract("w1", path);
  assert.equal(b.m.forModel("m").match("w1", path), path.length);
  a.m.forModel("m").retract("w1", path);
  assert.equal(b.m.forModel("m").match("w1", path), 0, "retracted long before the 60 s TTL");
  assert.equal(b.m.forModel("m").match("w1", other), other.length, "another prompt's entry stays");
  assert.equal(b.m.table("m")?.size("w1"), 1);
  assert.equal(await metric(a.registry, "infera_peer_retractions_total", { direction: "sent" }), 1);
  assert.equal(await metric(b.registry, "infera_peer_retractions_total", { direction: "applied" }), 1);
  // A retraction of what b never had (lost announcement) changes nothing.
  a.m.forModel("m").retract("w2", path);
  assert.equal(b.m.table("m")?.size(), 1);
});

test("the bridge retracts its announcement when its own entry ends (PendingPrefixes onEnd)", async () => {
  const { PendingPrefixes } = await import("../../../src/router/pipeline/pending-prefixes.ts");
  const ended: [string, readonly number[]][] = [];
  let now = 0;
  const pending = new PendingPrefixes({ graceMs: 100, onEnd: (w, p) => ended.push([w, p]), now: () => now });
  const path = tree.path(words("ends", 50));
  const failed = pending.add("w1", path);
  const prefilled = pending.add("w2", path);
  failed.dropped("failed");
  assert.deepEqual(ended, [["w1", path]]);
  prefilled.prefilled();
  now = 200; // past the grace, unconfirmed
  assert.equal(pending.match("w2", path), 0);
  assert.deepEqual(
    ended.map(([w]) => w),
    ["w1", "w2"],
  );
});
