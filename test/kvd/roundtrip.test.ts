import assert from "node:assert/strict";
import { statSync } from "node:fs";
import { after, before, describe, it } from "node:test";
import { KvdClient } from "../../src/kvd/client.ts";
import type { KvdDaemon } from "../../src/kvd/daemon.ts";
import { bytesFor, MiB, startTestKvd, tempDir } from "./helpers.ts";

describe("kvd round trip", () => {
  const tmp = tempDir();
  let kvd: KvdDaemon;
  let c: KvdClient;
  before(async () => {
    kvd = await startTestKvd(tmp.dir, {
      ramBytes: 8 * MiB,
      diskBytes: 64 * MiB,
      tcp: { host: "127.0.0.1", port: 0 },
    });
    c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "llama" });
  });
  after(async () => {
    c.close();
    await kvd.close();
    tmp.cleanup();
  });

  it("creates the Unix socket with mode 0600", () => {
    assert.equal(statSync(kvd.socketPath!).mode & 0o777, 0o600);
  });

  it("PUT then GET through L2 returns the bytes from the client's own arena mapping", async () => {
    const data = bytesFor("a", 1 * MiB + 123);
    assert.deepEqual(await c.put([{ key: "a", data }]), [true]);
    const [got] = await c.get(["a"]);
    assert.ok(got);
    assert.equal(got.tier, "l2");
    assert.ok(got.offset >= 0, "answered with an arena offset");
    assert.equal(got.buf.buffer, c.arena!.buf.buffer, "the Buffer aliases the client's mapping");
    assert.ok(got.buf.equals(data));
    assert.equal(await c.release([got.lease]), 1);
  });

  it("zero-copy PUT (ALLOC/COMMIT) and batch GET, copy path, EXISTS, LOOKUP, DELETE", async () => {
    const items = ["z1", "z2", "z3"].map((key) => ({ key, data: bytesFor(key, 256 * 1024) }));
    assert.deepEqual(await c.putArena(items), [true, true, true]);
    const dest = Buffer.alloc(300 * 1024);
    assert.equal(await c.getCopyInto("z2", dest), 256 * 1024);
    assert.ok(dest.subarray(0, 256 * 1024).equals(items[1]!.data), "received into the caller's buffer");
    assert.equal(await c.getCopyInto("nope", dest), null);
    const copies = await c.getCopy(["z1", "nope", "z3"]);
    assert.ok(copies[0]!.equals(items[0]!.data));
    assert.equal(copies[1], null);
    assert.ok(copies[2]!.equals(items[2]!.data));
    assert.deepEqual(await c.exists(["z1", "nope"]), ["l2", null]);
    assert.equal(await c.lookup(["z1", "z2", "nope", "z3"]), 2);
    assert.deepEqual(await c.delete(["z2"]), [true]);
    assert.equal(await c.lookup(["z1", "z2", "z3"]), 1);
  });

  it("retention none is never stored", async () => {
    assert.deepEqual(await c.put([{ key: "n", data: Buffer.alloc(4096, 1), retention: "none" }]), [false]);
    assert.deepEqual(await c.exists(["n"]), [null]);
  });

  it("a chunk evicted from L2 is served from L3 and promoted back to L2", async () => {
    const keys = Array.from({ length: 8 }, (_, i) => `big${i}`);
    for (const k of keys) assert.deepEqual(await c.put([{ key: k, data: bytesFor(k, 2 * MiB) }]), [true]);
    await kvd.store.drain();
    // 16 MiB written into an 8 MiB arena: the first ones only remain on disk.
    assert.equal((await c.exists(["big0"]))[0], "l3");
    const [g] = await c.get(["big0"]);
    assert.ok(g);
    assert.equal(g.tier, "l3");
    assert.ok(g.buf.equals(bytesFor("big0", 2 * MiB)));
    assert.ok(g.offset >= 0, "promoted into the arena");
    await c.release([g.lease]);
    assert.equal((await c.exists(["big0"]))[0], "l2");
    const st = (await c.stats()) as { tiers: { l3: { hits: number }; l2: { evictions: { long: number } } } };
    assert.ok(st.tiers.l3.hits >= 1);
    assert.ok(st.tiers.l2.evictions.long >= 4);
  });

  it("serves TCP clients over the copy path (no arena)", async () => {
    const t = await KvdClient.connect({ tcp: { host: "127.0.0.1", port: kvd.tcpPort! }, namespace: "llama" });
    try {
      assert.equal(t.arena, null);
      const data = bytesFor("tcp", 300_000);
      assert.deepEqual(await t.put([{ key: "tcp", data }]), [true]);
      const [g] = await t.get(["tcp"]);
      assert.ok(g?.buf.equals(data));
      assert.equal(g?.offset, -1);
    } finally {
      t.close();
    }
  });

  it("--socket-group makes the socket 0660 and owned by that group", async (t) => {
    const { readFileSync } = await import("node:fs");
    const line = readFileSync("/etc/group", "utf8")
      .split("\n")
      .find((l) => l.startsWith("daemon:"));
    if (!line || process.getuid?.() !== 0) {
      t.skip("needs root and a 'daemon' group to chown to");
      return;
    }
    const gid = Number(line.split(":")[2]);
    const d = tempDir();
    const k = await startTestKvd(d.dir, { socketGroup: "daemon", diskDir: undefined });
    try {
      const st = statSync(k.socketPath!);
      assert.equal(st.mode & 0o777, 0o660);
      assert.equal(st.gid, gid);
    } finally {
      await k.close();
      d.cleanup();
    }
  });

  it("STATS reports bytes, hits and hit rates per tier, and clients", async () => {
    const st = (await c.stats()) as {
      clients: number;
      lookups: number;
      tiers: { l2: { bytes: number; hits: number; hit_rate: number }; l3: { bytes: number; hits: number } };
      ais: { active: boolean; reason: string };
    };
    assert.ok(st.clients >= 1);
    assert.ok(st.tiers.l2.bytes > 0 && st.tiers.l3.bytes > 0);
    assert.ok(st.tiers.l2.hits > 0);
    assert.ok(st.tiers.l2.hit_rate > 0 && st.tiers.l2.hit_rate <= 1);
    assert.equal(st.ais.active, false);
    assert.match(st.ais.reason, /INFERA_KVD_AIS|hipFile/);
  });

  it("exports Prometheus metrics", async (t) => {
    const d2 = tempDir();
    const k2 = await startTestKvd(d2.dir, { metricsPort: 0, diskDir: undefined });
    t.after(() => d2.cleanup());
    try {
      const m = await (await fetch(`http://127.0.0.1:${k2.metricsPort}/metrics`)).text();
      assert.match(m, /kvd_tier_bytes\{tier="l2"\} 0/);
      assert.match(m, /kvd_clients 0/);
      assert.match(m, /kvd_evictions_total\{tier="l2",class="short"\} 0/);
    } finally {
      await k2.close();
    }
  });
});
