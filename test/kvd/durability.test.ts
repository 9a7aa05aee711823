import assert from "node:assert/strict";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { KvdClient } from "../../src/kvd/client.ts";
import { chunkId } from "../../src/kvd/types.ts";
import { bytesFor, chunkFilesOnDisk, spawnKvd, startTestKvd, tempDir, waitExit } from "./helpers.ts";

describe("kvd L3 durability", () => {
  const tmp = tempDir();
  after(() => tmp.cleanup());

  it("a restart keeps L3; a corrupted file is detected and never served", async () => {
    const dir = join(tmp.dir, "restart");
    let kvd = await startTestKvd(dir);
    let c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "m" });
    const keys = ["r0", "r1", "r2", "r3"];
    await c.put(keys.map((k) => ({ key: k, data: bytesFor(k, 512 * 1024) })));
    await kvd.store.drain();
    const victim = kvd.store.disk!.index.get(chunkId("m", "r2"))!.path;
    c.close();
    await kvd.close();

    // Flip one payload byte: the header still parses, only the payload crc can catch it.
    const f = readFileSync(victim);
    f[f.length - 10] = f[f.length - 10]! ^ 0xff;
    writeFileSync(victim, f);
    // A half-written temp file from a "crash" must be ignored and cleaned up.
    writeFileSync(join(dir, "disk", ".tmp-999-1-deadbeef"), Buffer.alloc(1000, 7));

    kvd = await startTestKvd(dir);
    c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "m" });
    try {
      assert.deepEqual(await c.exists(keys), ["l3", "l3", "l3", "l3"]);
      const got = await c.get(keys);
      assert.equal(got[0]!.tier, "l3");
      assert.ok(got[0]!.buf.equals(bytesFor("r0", 512 * 1024)));
      assert.ok(got[3]!.buf.equals(bytesFor("r3", 512 * 1024)));
      assert.equal(got[2], null, "the corrupted chunk reads as a miss");
      await c.release(got.map((g) => g?.lease ?? 0));
      const st = (await c.stats()) as { tiers: { l3: { corrupt_dropped: number } } };
      assert.equal(st.tiers.l3.corrupt_dropped, 1);
      assert.equal(
        readdirSync(join(dir, "disk")).some((n) => n.startsWith(".tmp-")),
        false,
      );
    } finally {
      c.close();
      await kvd.close();
    }
  });

  it("kill -9 during a write storm, then restart: every chunk served is intact", async () => {
    const dir = join(tmp.dir, "storm");
    const sock = join(dir, "kvd.sock");
    const args = [
      "--socket",
      sock,
      "--ram-bytes",
      "32MiB",
      "--disk-dir",
      join(dir, "disk"),
      "--disk-bytes",
      "1GiB",
    ];
    const { mkdirSync } = await import("node:fs");
    mkdirSync(dir, { recursive: true });
    let child = await spawnKvd(args, sock);
    const written: string[] = [];
    let stop = false;
    const errors: string[] = [];
    const writers = Array.from({ length: 3 }, async (_, w) => {
      const c = await KvdClient.connect({
        socketPath: sock,
        namespace: "storm",
        handshakeTimeoutMs: 20000,
      }).catch((e: Error) => {
        errors.push(`writer ${w} connect: ${e.message}`);
        return null;
      });
      if (!c) return;
      for (let i = 0; !stop; i++) {
        const key = `w${w}-${i}`;
        // Sizes vary so that crashes land at different points of different files.
        const size = 64 * 1024 + ((i * 7919) % 400) * 1024;
        written.push(key);
        try {
          await c.put([{ key, data: bytesFor(key, size) }]);
        } catch {
          break;
        }
      }
      c.close();
    });
    // Kill once chunks are landing on disk (writes in flight at that moment are the point).
    const countFiles = () => chunkFilesOnDisk(join(dir, "disk"));
    const deadline = Date.now() + 20000;
    while (countFiles() < 10 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    await new Promise((r) => setTimeout(r, 300));
    child.kill("SIGKILL");
    stop = true;
    await waitExit(child);
    await Promise.all(writers);
    assert.ok(written.length >= 10, `storm wrote ${written.length} chunks; ${errors.join("; ")}`);

    child = await spawnKvd(args, sock);
    const c = await KvdClient.connect({ socketPath: sock, namespace: "storm" });
    try {
      let served = 0;
      for (let i = 0; i < written.length; i += 32) {
        const batch = written.slice(i, i + 32);
        const got = await c.getCopy(batch);
        got.forEach((b, j) => {
          if (!b) return;
          served++;
          const key = batch[j]!;
          const w = Number(key.slice(1, key.indexOf("-")));
          assert.ok(w >= 0);
          const size = b.length;
          assert.ok(b.equals(bytesFor(key, size)), `chunk ${key} is corrupt`);
          assert.equal(
            size,
            64 * 1024 + ((Number(key.split("-")[1]) * 7919) % 400) * 1024,
            `chunk ${key} is truncated`,
          );
        });
      }
      assert.ok(served > 0, "some chunks survived on L3");
    } finally {
      c.close();
      child.kill("SIGTERM");
      await waitExit(child);
    }
  });
});
