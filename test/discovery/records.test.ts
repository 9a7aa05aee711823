/**
 * Issue #17 hardening of the discovery boundary (real etcd):
 * - every record passes one schema (etcd, memory, static); an invalid one is skipped with one
 *   warning naming its key, not one per re-list, and the others keep serving;
 * - two keys carrying one worker id: deleting either leaves the id served by the other;
 * - a registry bigger than gRPC's default 4 MiB message is listed in pages.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { after, before, describe, it } from "node:test";
import { Etcd3 } from "etcd3";
import { type Logger, pino } from "pino";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import { KeyedWorkerSet } from "../../src/discovery/keyed-set.ts";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { validateWorkerRecord } from "../../src/discovery/schema.ts";
import { StaticDiscovery } from "../../src/discovery/static.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { mixedRecord } from "../helpers/records.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

/** A logger that keeps its warn lines, to count them. */
function capture(): { log: Logger; warns: () => Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const out = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split("\n")) if (l.trim()) lines.push(JSON.parse(l));
      cb();
    },
  });
  const log = pino({ level: "warn" }, out);
  return { log, warns: () => lines.filter((l) => l.level === 40) };
}

async function waitFor(cond: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const rec = (id: string, o: Partial<WorkerRecord> = {}) =>
  mixedRecord({ id, model: "m1", url: `http://127.0.0.1:9/${id}`, ...o });

const ids = (w: { workers(): readonly WorkerRecord[] }) =>
  w
    .workers()
    .map((r) => r.id)
    .sort();

/** The records issue #17 reported, each with the field that broke requests. */
const BAD: Array<[string, Record<string, unknown>]> = [
  ["bs0", { blockSize: 0 }],
  ["ftp", { url: "ftp://127.0.0.1:21" }],
  ["numnames", { servedModelNames: [1, 2] }],
  ["bsstr", { blockSize: "16" }],
  ["dp0", { dpSize: 0 }],
  ["port", { connector: { kind: "nixl", bootstrapPort: 70000 } }],
  // vLLM's default KV-event endpoint "tcp://*:5557" is a *bind* address (the publisher binds
  // it): vllm-project/vllm vllm/config/kv_events.py @ b91ee1b47c8e8462ada5e5b8d18244bc96a0ebbc.
  // A record must carry where subscribers connect, never the wildcard.
  ["kvwild", { kvEvents: { endpoint: "tcp://*:5557", topic: "", framing: "seq" } }],
  [
    "rank",
    {
      kvEvents: {
        endpoint: "tcp://h:1",
        topic: "",
        framing: "seq",
        ranks: [{ dpRank: -1, endpoint: "tcp://h:1" }],
      },
    },
  ],
  ["blocks", { kvBlocks: 1.5 }],
];

describe("discovery record validation (schema.ts)", () => {
  it("accepts a full record, including kvEvents.ranks and kvBlocks", () => {
    const r = rec("ok", {
      kvBlocks: 1000,
      dpSize: 2,
      dpRank: 1,
      kvEvents: {
        endpoint: "tcp://10.0.0.5:5557",
        replayEndpoint: "tcp://10.0.0.5:5558",
        topic: "",
        framing: "seq",
        ranks: [
          { dpRank: 0, endpoint: "tcp://10.0.0.5:5557", replayEndpoint: "tcp://10.0.0.5:5558" },
          { dpRank: 1, endpoint: "tcp://10.0.0.5:5558" },
        ],
      },
      connector: { kind: "mooncake", bootstrapHost: "10.0.0.5", bootstrapPort: 8998 },
      labels: { zone: "a" },
      natsSubject: "infera.w.ok",
    });
    const v = validateWorkerRecord(r);
    assert.ok(v.ok, v.ok ? "" : v.error);
    // Nothing is stripped: the validated record equals the input, field for field.
    if (v.ok) assert.deepEqual(v.record, r);
  });

  it("keeps a MoRIIO record's transferMode (the router runs WRITE workers concurrently)", () => {
    const connector = {
      kind: "moriio" as const,
      bootstrapHost: "10.0.0.5",
      handshakePort: 6301,
      notifyPort: 61005,
      transferMode: "WRITE" as const,
    };
    const v = validateWorkerRecord(rec("w", { connector }));
    assert.ok(v.ok, v.ok ? "" : v.error);
    if (v.ok) assert.equal(v.record.connector.transferMode, "WRITE");
  });

  for (const [name, bad] of BAD) {
    it(`refuses ${name}: ${JSON.stringify(bad)}`, () => {
      const v = validateWorkerRecord({ ...rec(name), ...bad });
      assert.equal(v.ok, false);
    });
  }

  it("memory discovery skips an invalid record with one warning naming it and keeps the rest", () => {
    const c = capture();
    const m = new MemoryDiscovery([rec("good"), { ...rec("bs0"), blockSize: 0 }], c.log);
    assert.equal(m.put({ ...rec("ftp"), url: "ftp://x:1" }), false);
    assert.equal(m.put(rec("good2")), true);
    assert.deepEqual(ids(m), ["good", "good2"]);
    assert.deepEqual(
      c.warns().map((w) => w.key),
      ["bs0", "ftp"],
    );
  });

  it("static discovery skips invalid records (bad url scheme, blockSize 0) and serves the rest", async () => {
    const c = capture();
    const s = new StaticDiscovery({
      records: [
        { ...rec("good") },
        { ...rec("bs0"), blockSize: 0 },
        { id: "ftp", url: "ftp://127.0.0.1:21", model: "m1", servedModelNames: ["m1"] },
        { id: "nourl", url: "not a url", model: "m1", servedModelNames: ["m1"] },
      ],
      logger: c.log,
    });
    await s.start();
    assert.deepEqual(ids(s), ["good"]);
    assert.deepEqual(
      c
        .warns()
        .map((w) => w.key)
        .sort(),
      ["bs0", "ftp", "nourl"],
    );
    await s.close();
  });

  it("static discovery skips invalid entries of a workers file, one warning each", async () => {
    const dir = mkdtempSync(join(tmpdir(), "workers-file-"));
    const file = join(dir, "workers.json");
    writeFileSync(
      file,
      JSON.stringify([
        { ...rec("good") },
        { id: "no-url", model: "m1", servedModelNames: ["m1"] },
        { ...rec("tp0"), tpSize: 0 },
        { ...rec("names"), servedModelNames: [7] },
      ]),
    );
    const c = capture();
    const s = new StaticDiscovery({ workersFile: file, logger: c.log });
    try {
      await s.start();
      assert.deepEqual(ids(s), ["good"]);
      const keys = c.warns().map((w) => String(w.key));
      assert.deepEqual(keys.sort(), [`${file}[1]`, "names", "tp0"]);
    } finally {
      await s.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("KeyedWorkerSet (one id shown per worker, state per key)", () => {
  it("a key whose record changes id moves it; ties on create revision go to the first key name", () => {
    const evs: string[] = [];
    const set = new KeyedWorkerSet((e) =>
      evs.push(
        e.type === "put" ? `put ${e.worker.id} ${e.worker.url}` : `${e.type} ${"id" in e ? e.id : ""}`,
      ),
    );
    set.set("/k/b", rec("w1", { url: "http://h:1/b" }), 5n);
    set.set("/k/a", rec("w1", { url: "http://h:1/a" }), 5n);
    assert.equal(set.workers()[0]?.url, "http://h:1/a");
    set.set("/k/a", rec("w2", { url: "http://h:1/a" }), 5n);
    assert.deepEqual(ids(set), ["w1", "w2"]);
    assert.equal(set.workers().find((w) => w.id === "w1")?.url, "http://h:1/b");
    set.remove("/k/b");
    assert.deepEqual(ids(set), ["w2"]);
    assert.deepEqual(evs, [
      "put w1 http://h:1/b",
      "put w1 http://h:1/a",
      "put w1 http://h:1/b",
      "put w2 http://h:1/a",
      "delete w1",
    ]);
  });
});

describe("etcd discovery hardening (real etcd)", () => {
  let etcd: EtcdHandle;
  let client: Etcd3;
  const closers: Array<() => Promise<void>> = [];
  before(async () => {
    etcd = await startEtcd();
    client = new Etcd3({ hosts: etcd.endpoint });
  });
  after(async () => {
    for (const c of closers.reverse()) await c().catch(() => undefined);
    client?.close();
    await etcd?.dispose();
  });

  const watcher = (prefix: string, logger?: Logger) => {
    const w = new EtcdWatcher({
      endpoints: [etcd.endpoint],
      prefix,
      backoff: { initialMs: 50, maxMs: 300 },
      startTimeoutMs: 20_000,
      logger,
    });
    closers.push(() => w.close());
    return w;
  };

  it("skips invalid records with one warning per key across re-lists; valid ones keep serving", async () => {
    const prefix = "/v1";
    await client.put(`${prefix}/workers/m1/good`).value(JSON.stringify(rec("good")));
    for (const [name, bad] of BAD)
      await client.put(`${prefix}/workers/m1/${name}`).value(JSON.stringify({ ...rec(name), ...bad }));
    await client.put(`${prefix}/workers/m1/junk`).value("{not json");
    const c = capture();
    const w = watcher(prefix, c.log);
    await w.start();
    assert.deepEqual(ids(w), ["good"]);
    const warnedKeys = () =>
      c
        .warns()
        .filter((l) => l.msg === "ignoring invalid worker record")
        .map((l) => String(l.key));
    assert.equal(warnedKeys().length, BAD.length + 1);
    for (const [name] of BAD) assert.ok(warnedKeys().includes(`${prefix}/workers/m1/${name}`), name);

    // A re-list (watch lost and regained) reads the same bad values again: no new warnings.
    const relists = w.relists;
    (w as unknown as { onWatchLost(w: unknown, e: Error): void }).onWatchLost(
      (w as unknown as { watcher: unknown }).watcher,
      new Error("test: watch dropped"),
    );
    await waitFor(() => w.relists > relists && !w.isDegraded(), 5000, "the re-list");
    assert.equal(warnedKeys().length, BAD.length + 1);
    assert.deepEqual(ids(w), ["good"]);

    // A good record turned bad leaves the set (it no longer names a usable worker); fixed, it returns.
    await client.put(`${prefix}/workers/m1/good`).value(JSON.stringify({ ...rec("good"), blockSize: 0 }));
    await waitFor(() => ids(w).length === 0, 2000, "good to leave after its value turned invalid");
    await client.put(`${prefix}/workers/m1/bs0`).value(JSON.stringify(rec("bs0")));
    await waitFor(() => ids(w).includes("bs0"), 2000, "bs0 to join once fixed");
  });

  it("two keys with one worker id: the first created is served; deleting either keeps the id", async () => {
    const prefix = "/dup";
    const first = `${prefix}/workers/m1/w1`;
    const second = `${prefix}/workers/m2/w1`;
    await client.put(first).value(JSON.stringify(rec("w1", { url: "http://127.0.0.1:9/first" })));
    await client.put(second).value(JSON.stringify(rec("w1", { url: "http://127.0.0.1:9/second" })));
    const w = watcher(prefix);
    await w.start();
    assert.deepEqual(ids(w), ["w1"]);
    assert.equal(w.workers()[0]?.url, "http://127.0.0.1:9/first");
    const events: string[] = [];
    w.onChange((e) => events.push(e.type === "put" ? `put ${e.worker.url}` : e.type));

    // Deleting the duplicate keeps the served worker, with no event at all.
    await client.delete().key(second);
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual(ids(w), ["w1"]);
    assert.deepEqual(events, []);

    // The duplicate comes back (created later: not served); then the served key goes.
    await client.put(second).value(JSON.stringify(rec("w1", { url: "http://127.0.0.1:9/second" })));
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(w.workers()[0]?.url, "http://127.0.0.1:9/first");
    await client.delete().key(first);
    await waitFor(
      () => w.workers()[0]?.url === "http://127.0.0.1:9/second",
      2000,
      "the other key to serve w1",
    );
    assert.deepEqual(ids(w), ["w1"]);
    assert.deepEqual(events, ["put http://127.0.0.1:9/second"]);

    // Only when no key carries the id is it deleted.
    await client.delete().key(second);
    await waitFor(() => ids(w).length === 0, 2000, "w1 to go");
    assert.deepEqual(events, ["put http://127.0.0.1:9/second", "delete"]);
  });

  it("lists a registry over gRPC's default 4 MiB message (1,100 records of 4 KB) in pages", async () => {
    const prefix = "/big";
    const pad = "x".repeat(4000);
    const n = 1100;
    for (let i = 0; i < n; i += 100) {
      await Promise.all(
        Array.from({ length: Math.min(100, n - i) }, (_, k) => {
          const id = `w${String(i + k).padStart(5, "0")}`;
          return client.put(`${prefix}/workers/m1/${id}`).value(JSON.stringify(rec(id, { labels: { pad } })));
        }),
      );
    }
    const w = watcher(prefix);
    await w.start();
    assert.equal(w.workers().length, n);
    assert.equal(w.isDegraded(), false);
  });
});
