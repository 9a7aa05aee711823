import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { after, describe, it } from "node:test";
import { KvdClient } from "../../src/kvd/client.ts";
import { chunkId } from "../../src/kvd/types.ts";
import { bytesFor, MiB, startTestKvd, tempDir } from "./helpers.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("kvd retention and eviction", () => {
  const tmp = tempDir();
  after(() => tmp.cleanup());

  it("evicts short before long, LRU within a class, and never a pinned or leased chunk", async () => {
    // Ephemeral: RAM only, so eviction really drops chunks and the order is observable.
    const kvd = await startTestKvd(`${tmp.dir}`, {
      ramBytes: 8 * MiB,
      ephemeral: true,
      socketPath: `${tmp.dir}/e.sock`,
    });
    const c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "m" });
    try {
      const put = (key: string, retention: "short" | "long") =>
        c.put([{ key, data: bytesFor(key, 1 * MiB), retention }]);
      await put("s1", "short");
      await put("l1", "long");
      await put("s2", "short");
      for (const k of ["l2", "l3", "l4", "l5", "l6"]) await put(k, "long");
      // Arena is full (8 × 1 MiB). Touch s1 so s2 becomes the LRU short chunk.
      const [g] = await c.get(["s1"]);
      await c.release([g!.lease]);
      await put("l7", "long");
      assert.deepEqual(await c.exists(["s1", "s2"]), ["l2", null], "LRU short chunk went first");
      await put("l8", "long");
      assert.deepEqual(await c.exists(["s1"]), [null], "then the other short one");
      assert.deepEqual(await c.pin(["l1"]), [true]);
      const [leased] = await c.get(["l2"]);
      await put("l9", "long");
      assert.deepEqual(
        await c.exists(["l1", "l2", "l3"]),
        ["l2", "l2", null],
        "pinned l1 and leased l2 kept; l3 evicted",
      );
      await c.release([leased!.lease]);
      await c.unpin(["l1"]);
      await put("l10", "long");
      assert.deepEqual(await c.exists(["l1"]), [null], "unpinned, l1 is the LRU long chunk again");
      const st = kvd.store.stats() as { tiers: { l2: { evictions: { short: number; long: number } } } };
      assert.deepEqual(st.tiers.l2.evictions, { short: 2, long: 2 });
      assert.equal(st.tiers.l2.evictions.short, 2);
    } finally {
      c.close();
      await kvd.close();
    }
  });

  it("expires chunks after their TTL from RAM and disk", async () => {
    const kvd = await startTestKvd(tmp.dir, { sweepMs: 50 });
    const c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "m" });
    try {
      assert.deepEqual(
        await c.put([
          { key: "t", data: bytesFor("t", 64 * 1024), ttlMs: 300 },
          { key: "keep", data: bytesFor("keep", 64 * 1024) },
        ]),
        [true, true],
      );
      await kvd.store.drain();
      const file = kvd.store.disk!.index.get(chunkId("m", "t"))!.path;
      assert.ok(existsSync(file), "written through to L3");
      assert.deepEqual(await c.exists(["t", "keep"]), ["l2", "l2"]);
      await sleep(600);
      assert.deepEqual(await c.exists(["t", "keep"]), [null, "l2"]);
      assert.deepEqual(await c.getCopy(["t"]), [null]);
      assert.equal(existsSync(file), false, "the L3 file was swept");
    } finally {
      c.close();
      await kvd.close();
    }
  });

  it("short chunks stay in RAM until pressure demotes them to L3", async () => {
    const kvd = await startTestKvd(tmp.dir, { ramBytes: 4 * MiB, socketPath: `${tmp.dir}/d.sock` });
    const c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "d" });
    try {
      await c.put([{ key: "s", data: bytesFor("s", 1 * MiB), retention: "short" }]);
      await kvd.store.drain();
      assert.equal(kvd.store.disk!.has(chunkId("d", "s")), false, "short is not written through");
      for (let i = 0; i < 4; i++)
        await c.put([{ key: `f${i}`, data: bytesFor(`f${i}`, 1 * MiB), retention: "short" }]);
      await kvd.store.drain();
      assert.deepEqual(await c.exists(["s"]), ["l3"], "demoted on eviction");
      const [b] = await c.getCopy(["s"]);
      assert.ok(b!.equals(bytesFor("s", 1 * MiB)));
    } finally {
      c.close();
      await kvd.close();
    }
  });
});
