import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Etcd3 } from "etcd3";
import { parseEndpoints, workersPrefix } from "../../src/discovery/etcd-client.ts";
import { EtcdRegistrar } from "../../src/discovery/etcd-registrar.ts";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import type { DiscoveryEvent, WorkerRecord } from "../../src/discovery/types.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { mixedRecord } from "../helpers/records.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

function record(id: string, model = "m1"): WorkerRecord {
  return mixedRecord({ id, model, url: `http://127.0.0.1:9/${id}` });
}

async function waitFor(cond: () => boolean, timeoutMs: number, what: string): Promise<number> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  return Date.now() - t0;
}

const ids = (w: EtcdWatcher) =>
  w
    .workers()
    .map((r) => r.id)
    .sort();

describe("etcd discovery (real etcd)", () => {
  let etcd: EtcdHandle;
  const closers: Array<() => Promise<void>> = [];
  before(async () => {
    etcd = await startEtcd();
  });
  after(async () => {
    for (const c of closers.reverse()) await c().catch(() => undefined);
    await etcd?.dispose();
  });

  const opts = (prefix: string) => ({
    endpoints: [etcd.endpoint],
    prefix,
    backoff: { initialMs: 50, maxMs: 300 },
  });

  it("parses endpoint lists", () => {
    assert.deepEqual(parseEndpoints("a:1, b:2,,"), ["a:1", "b:2"]);
    assert.deepEqual(parseEndpoints(["a:1,b:2", "c:3"]), ["a:1", "b:2", "c:3"]);
    assert.equal(workersPrefix("/x/"), "/x/workers/");
  });

  it("lists existing records, then follows puts and revokes within 1 s", async () => {
    const prefix = "/t1";
    const r1 = new EtcdRegistrar({ ...opts(prefix), leaseTtlSeconds: 5 });
    closers.push(() => r1.close());
    await r1.register(record("w1"));
    const watcher = new EtcdWatcher(opts(prefix));
    closers.push(() => watcher.close());
    await watcher.start();
    assert.deepEqual(ids(watcher), ["w1"]);
    assert.equal(watcher.workers()[0]?.url, "http://127.0.0.1:9/w1");

    const events: DiscoveryEvent[] = [];
    watcher.onChange((e) => events.push(e));
    const r2 = new EtcdRegistrar({ ...opts(prefix), leaseTtlSeconds: 5 });
    closers.push(() => r2.close());
    await r2.register(record("w2", "m 2/x"));
    const seenMs = await waitFor(() => ids(watcher).includes("w2"), 1000, "w2 to appear");
    assert.ok(seenMs < 1000);
    assert.equal(watcher.workers().find((r) => r.id === "w2")?.model, "m 2/x");

    await r1.deregister();
    await waitFor(() => !ids(watcher).includes("w1"), 1000, "w1 to go after revoke");
    assert.deepEqual(
      events.map((e) => e.type),
      ["put", "delete"],
    );
  });

  it("ignores malformed records instead of failing", async () => {
    const prefix = "/t2";
    const raw = new Etcd3({ hosts: etcd.endpoint });
    closers.push(async () => raw.close());
    await raw.put(`${prefix}/workers/m/bad`).value("{not json");
    await raw.put(`${prefix}/workers/m/noid`).value(JSON.stringify({ model: "m" }));
    const watcher = new EtcdWatcher(opts(prefix));
    closers.push(() => watcher.close());
    await watcher.start();
    assert.deepEqual(ids(watcher), []);
    await raw.put(`${prefix}/workers/m/good`).value(JSON.stringify(record("good", "m")));
    await waitFor(() => ids(watcher).includes("good"), 1000, "good record");
  });

  it("a record whose lease is not kept alive disappears within the TTL", async () => {
    const prefix = "/t3";
    const raw = new Etcd3({ hosts: etcd.endpoint });
    closers.push(async () => raw.close());
    const watcher = new EtcdWatcher(opts(prefix));
    closers.push(() => watcher.close());
    await watcher.start();
    // A lease without keep-alive stands for a launcher killed with -9.
    const lease = raw.lease(2, { autoKeepAlive: false });
    await lease.put(`${prefix}/workers/m/dead`).value(JSON.stringify(record("dead", "m")));
    await waitFor(() => ids(watcher).includes("dead"), 1000, "dead to appear");
    const t0 = Date.now();
    await waitFor(() => !ids(watcher).includes("dead"), 4000, "dead to expire");
    assert.ok(Date.now() - t0 <= 3500, "expired within TTL (+ etcd's expiry tick)");
  });

  it("keeps the last set through an etcd outage and re-registers after it", async () => {
    const prefix = "/t4";
    const reg = new EtcdRegistrar({ ...opts(prefix), leaseTtlSeconds: 1 });
    closers.push(() => reg.close());
    await reg.register(record("survivor"));
    const watcher = new EtcdWatcher(opts(prefix));
    closers.push(() => watcher.close());
    await watcher.start();
    const events: string[] = [];
    watcher.onChange((e) => events.push(e.type));
    assert.deepEqual(ids(watcher), ["survivor"]);

    await etcd.kill();
    await waitFor(() => watcher.isDegraded(), 3000, "degraded");
    // Longer than 2 x TTL: the registrar's lease is declared lost on the client side.
    await new Promise((r) => setTimeout(r, 3000));
    assert.deepEqual(ids(watcher), ["survivor"], "last known set kept while degraded");
    assert.ok(events.includes("degraded"));

    await etcd.restart();
    await waitFor(() => !watcher.isDegraded(), 5000, "restored");
    assert.ok(events.includes("restored"));
    await waitFor(() => reg.grants >= 2, 5000, "lease re-granted");
    // The record must be there and stay there under the new lease, after the old one's TTL.
    await new Promise((r) => setTimeout(r, 2500));
    const raw = new Etcd3({ hosts: etcd.endpoint });
    closers.push(async () => raw.close());
    const keys = await raw.getAll().prefix(`${prefix}/workers/`).keys();
    assert.deepEqual(keys, [`${prefix}/workers/m1/survivor`]);
    assert.deepEqual(ids(watcher), ["survivor"]);
  });
});
