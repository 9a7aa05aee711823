import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { KvdClient } from "../../src/kvd/client.ts";
import type { KvdDaemon } from "../../src/kvd/daemon.ts";
import { freePort } from "../helpers/ports.ts";
import { bytesFor, MiB, startTestKvd, tempDir } from "./helpers.ts";

const REDIS = process.env.REDIS_SERVER ?? "redis-server";
const haveRedis = spawnSync(REDIS, ["--version"]).status === 0;

describe("kvd L4 (Redis)", {
  skip: haveRedis ? false : "redis-server not installed (scripts/install-system-deps.sh)",
}, () => {
  const tmp = tempDir();
  let redis: ChildProcess;
  let port: number;
  let kvd: KvdDaemon;
  before(async () => {
    port = await freePort();
    redis = spawn(
      REDIS,
      ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
      {
        stdio: "ignore",
      },
    );
    for (let i = 0; i < 100; i++) {
      const ok = await new Promise<boolean>((resolve) => {
        import("node:net").then(({ connect }) => {
          const s = connect(port, "127.0.0.1", () => {
            s.destroy();
            resolve(true);
          });
          s.on("error", () => resolve(false));
        });
      });
      if (ok) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    // No disk tier: a chunk evicted from RAM can only come back from Redis.
    kvd = await startTestKvd(tmp.dir, {
      ramBytes: 4 * MiB,
      diskDir: undefined,
      remoteUrl: `redis://127.0.0.1:${port}/0`,
    });
  });
  after(async () => {
    await kvd?.close();
    redis?.kill("SIGKILL");
    tmp.cleanup();
  });

  it("long chunks are written through to Redis and served from L4 after eviction", async () => {
    const c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "r" });
    try {
      const keys = ["q0", "q1", "q2", "q3", "q4", "q5"];
      for (const k of keys) await c.put([{ key: k, data: bytesFor(k, 1 * MiB) }]);
      await kvd.store.drain();
      assert.equal((await c.exists(["q0"]))[0], "l4");
      const [g] = await c.get(["q0"]);
      assert.equal(g?.tier, "l4");
      assert.ok(g?.buf.equals(bytesFor("q0", 1 * MiB)));
      await c.release([g!.lease]);
      assert.equal((await c.exists(["q0"]))[0], "l2", "promoted into the arena");
      assert.deepEqual(await c.delete(["q1"]), [true], "q1 lived only in L4");
      assert.equal((await c.exists(["q1"]))[0], null, "DELETE removed it from Redis");
      const st = (await c.stats()) as { tiers: { l4: { hits: number } } };
      assert.equal(st.tiers.l4.hits, 1);
    } finally {
      c.close();
    }
  });
});
