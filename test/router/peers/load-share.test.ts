/**
 * One engine scrape shared among replicas (src/router/peers/load-share.ts, issue #32), in one
 * process over an in-memory bus: every replica that hears the same live set picks the same
 * owner for each worker, the owners split the workers about evenly, a replica gone moves only
 * its own workers; readings are dated on the receiver's clock; busy hints; the wire's bounds;
 * forged, replayed and stale reports refused. Real `infera server` processes sharing one scrape:
 * test/router/peers/shared-scrape.test.ts.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { pack } from "msgpackr";
import { Registry } from "prom-client";
import { LIVE_PERIODS } from "../../../src/router/peers/load-share.ts";
import {
  encodeLoadReport,
  isLoadReport,
  MAX_READINGS,
  parseLoadReport,
} from "../../../src/router/peers/load-wire.ts";
import { PeerMesh, type PeerMeshOptions } from "../../../src/router/peers/mesh.ts";
import type { PeerTransport, ScrapedReading } from "../../../src/router/peers/types.ts";
import { openFrame, sealFrame } from "../../../src/router/peers/wire.ts";
import { createLogger } from "../../../src/util/log.ts";

const logger = createLogger("test");
logger.level = "silent";

/** Frames published by one mesh arrive at every other on the same bus (unless cut off). */
class Bus {
  readonly members: PeerMesh[] = [];
  readonly down = new Set<PeerMesh>();
  transport(): PeerTransport {
    return {
      kind: "zmq",
      endpoint: "bus",
      publish: (_model, frame) => {
        for (const m of this.members) if (!this.down.has(m)) m.receive(frame);
      },
      frames: async function* () {},
      close: async () => {},
    };
  }
}

/** A mesh with small table bounds (announcements do not matter here) and its own registry. */
function mesh(transport: PeerTransport, o: Partial<PeerMeshOptions> = {}): PeerMesh {
  return new PeerMesh({
    transport,
    secret: null,
    ttlMs: 1000,
    maxNodes: 16,
    maxEntriesPerWorker: 4,
    maxEntries: 8,
    registry: new Registry(),
    logger,
    ...o,
  });
}

function member(bus: Bus, id: string, now: () => number, secret: string | null = "s") {
  const registry = new Registry();
  const m = mesh(bus.transport(), {
    secret: secret === null ? null : Buffer.from(secret),
    registry,
    replicaId: id,
    now,
  });
  bus.members.push(m);
  return { m, load: m.load!, registry };
}

async function metric(reg: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = await reg.getSingleMetric(name)?.get();
  let sum = 0;
  for (const v of m?.values ?? [])
    if (Object.entries(labels).every(([k, x]) => (v.labels as Record<string, string>)[k] === x))
      sum += v.value;
  return sum;
}

const WORKERS = Array.from({ length: 300 }, (_, i) => `worker-${i}`);
const PERIOD = 100;

test("ownership: one owner per worker, the same in every replica, about a third each; a replica gone moves only its own", () => {
  let now = 1_000_000;
  const bus = new Bus();
  const rs = ["replica-a", "replica-b", "replica-c"].map((id) => member(bus, id, () => now));
  // Alone (nobody heard yet): each replica scrapes everything itself, as without peers.
  for (const r of rs) assert.ok(WORKERS.every((w) => r.load.isMine(w)));
  for (const r of rs) assert.equal(r.load.liveCount(), 1, "alone: flow control counts one replica");
  for (const r of rs) r.load.report([], [], PERIOD);
  for (const r of rs) assert.deepEqual(r.load.liveReplicas(), ["replica-a", "replica-b", "replica-c"]);
  for (const r of rs) assert.equal(r.load.liveCount(), 3);
  const owners = (r: (typeof rs)[number]) => WORKERS.map((w) => r.load.ownerOf(w));
  const first = owners(rs[0]);
  assert.deepEqual(owners(rs[1]), first, "b agrees with a");
  assert.deepEqual(owners(rs[2]), first, "c agrees with a");
  for (const w of WORKERS)
    assert.equal(rs.filter((r) => r.load.isMine(w)).length, 1, `${w} has exactly one owner that knows it`);
  const share = (id: string) => first.filter((o) => o === id).length;
  for (const r of rs)
    assert.ok(share(r.m.replicaId) > 60 && share(r.m.replicaId) < 140, `${share(r.m.replicaId)} of 300`);

  // c stops reporting: a and b count it live for LIVE_PERIODS periods, then hash over {a, b}.
  bus.down.add(rs[2].m);
  now += PERIOD;
  rs[0].load.report([], [], PERIOD);
  rs[1].load.report([], [], PERIOD);
  assert.deepEqual(owners(rs[0]), first, "c still live within its window");
  now += LIVE_PERIODS * PERIOD;
  rs[0].load.report([], [], PERIOD);
  rs[1].load.report([], [], PERIOD);
  assert.deepEqual(rs[0].load.liveReplicas(), ["replica-a", "replica-b"]);
  assert.equal(rs[0].load.liveCount(), 2, "c's window is over");
  const after = owners(rs[0]);
  assert.deepEqual(owners(rs[1]), after);
  for (let i = 0; i < WORKERS.length; i++) {
    if (first[i] === "replica-c") assert.notEqual(after[i], "replica-c", "c's workers move");
    else assert.equal(after[i], first[i], "the others' stay where they were");
  }
  // b's server closes: it says goodbye, and a takes everything over at once.
  rs[1].load.leave();
  assert.deepEqual(rs[0].load.liveReplicas(), ["replica-a"]);
  assert.equal(rs[0].load.liveCount(), 1);
  assert.ok(WORKERS.every((w) => rs[0].load.isMine(w)));
});

test("readings: filed with the receiver's date (age + transit, a skewed clock bounded), busy hints, counted", async () => {
  let nowA = 5_000_000;
  let nowB = nowA;
  const bus = new Bus();
  const a = member(bus, "a", () => nowA);
  const b = member(bus, "b", () => nowB);
  const got: ScrapedReading[] = [];
  b.load.onReadings = (rs) => got.push(...rs);
  const reading: ScrapedReading = {
    worker: "w1",
    running: 3,
    waiting: 7,
    kvUsage: 0.5,
    pdBacklog: 2,
    scrapedAt: nowA - 40,
  };
  a.load.report([reading], ["w9"], PERIOD);
  assert.deepEqual(got, [{ ...reading, scrapedAt: nowB - 40 }]);
  assert.ok(b.load.busyElsewhere("w9"), "a has requests in flight on w9");
  assert.ok(!b.load.busyElsewhere("w1"));
  assert.ok(!a.load.busyElsewhere("w9"), "its own hints are skipped");
  // B's clock runs 250 ms ahead (within a's live window): the transit counted is at most one
  // period, not the skew.
  nowB += 250;
  nowA += 10;
  got.length = 0;
  a.load.report([{ ...reading, scrapedAt: nowA - 5 }], [], PERIOD);
  assert.equal(got[0].scrapedAt, nowB - PERIOD - 5);
  assert.equal(got[0].pdBacklog, 2);
  assert.equal(await metric(a.registry, "infera_peer_load_readings_total", { direction: "sent" }), 2);
  assert.equal(await metric(b.registry, "infera_peer_load_readings_total", { direction: "received" }), 2);
  // The busy hint lasts the sender's live window.
  nowB += LIVE_PERIODS * PERIOD + 1;
  assert.ok(!b.load.busyElsewhere("w9"));
  // Clocks further apart than the window: a's reports read as stale, so b counts a as gone and
  // scrapes everything itself (no sharing, no wrong owner).
  a.load.report([], ["w9"], PERIOD);
  assert.deepEqual(b.load.liveReplicas(), ["b"]);
  assert.ok(!b.load.busyElsewhere("w9"));
  assert.equal(await metric(b.registry, "infera_peer_announcements_dropped_total", { reason: "stale" }), 1);
});

test("load reports: only rightful senders (MAC), in sequence, fresh; bounded frames; own reports skipped", async () => {
  const now = 9_000_000;
  const bus = new Bus();
  const b = member(bus, "b", () => now);
  let filed = 0;
  b.load.onReadings = (rs) => {
    filed += rs.length;
  };
  const report = (
    sender: string,
    seq: number,
    over: Partial<Parameters<typeof encodeLoadReport>[0]> = {},
  ) => ({
    sender,
    seq,
    sentAt: now,
    periodMs: PERIOD,
    readings: [{ worker: "w1", running: 1, waiting: 0, kvUsage: 0.1, ageMs: 5 }],
    busy: [],
    ...over,
  });
  const s = Buffer.from("s");
  const dropped = (reason: string) =>
    metric(b.registry, "infera_peer_announcements_dropped_total", { reason });

  b.m.receive(encodeLoadReport(report("x", 1), s));
  assert.equal(filed, 1);
  b.m.receive(encodeLoadReport(report("x", 2), Buffer.from("wrong")));
  b.m.receive(encodeLoadReport(report("x", 3), null));
  assert.equal(await dropped("auth"), 2, "forged and unsigned");
  b.m.receive(encodeLoadReport(report("x", 1), s));
  assert.equal(await dropped("replay"), 1);
  b.m.receive(encodeLoadReport(report("x", 4, { sentAt: now - LIVE_PERIODS * PERIOD - 1 }), s));
  assert.equal(await dropped("stale"), 1, "older than the sender's live window");
  b.m.receive(encodeLoadReport(report("b", 5), s));
  assert.equal(filed, 1, "own reports are skipped");
  // Too many readings in one frame, a bad number, a wrong shape: malformed, nothing filed.
  const many = Array.from({ length: MAX_READINGS + 1 }, (_, i) => ({
    worker: `w${i}`,
    running: 0,
    waiting: 0,
    kvUsage: 0,
    ageMs: 0,
  }));
  b.m.receive(encodeLoadReport(report("x", 6, { readings: many }), s));
  b.m.receive(sealFrame(pack([2, "x", 7, now, PERIOD, [["w1", -1, 0, 0, -1, 0]], []]), s));
  b.m.receive(sealFrame(pack([2, "x", 8, now, 0, [], []]), s));
  b.m.receive(Buffer.concat([Buffer.of(2), Buffer.alloc(1024 * 1024 + 1)]));
  b.m.receive(sealFrame(pack([2, "x", 9, now, PERIOD, [], [], 2]), s));
  assert.equal(await dropped("malformed"), 5);
  assert.equal(filed, 1);
  // A sender splits a long list over frames within the bounds.
  const frames: Uint8Array[] = [];
  const solo = mesh(
    {
      kind: "zmq",
      endpoint: "x",
      publish: (_m, f) => frames.push(f),
      frames: async function* () {},
      close: async () => {},
    },
    { secret: s, replicaId: "solo", now: () => now },
  );
  solo.load!.report(
    many.map(({ ageMs, ...r }) => ({ ...r, scrapedAt: now - ageMs })),
    [],
    PERIOD,
  );
  assert.equal(frames.length, 2);
  for (const f of frames) {
    const o = openFrame(f, s);
    assert.ok(o.ok && isLoadReport(o.v) && parseLoadReport(o.v).ok);
    b.m.receive(f);
  }
  assert.equal(filed, 1 + MAX_READINGS + 1);
});

test("peers.shareLoad false: no load share, reports ignored", () => {
  const m = mesh(new Bus().transport(), { shareLoad: false });
  assert.equal(m.load, null);
  m.receive(
    encodeLoadReport(
      { sender: "x", seq: 1, sentAt: Date.now(), periodMs: 100, readings: [], busy: [] },
      null,
    ),
  );
});
