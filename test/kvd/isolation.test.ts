import assert from "node:assert/strict";
import net from "node:net";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { KvdClient, KvdRequestError } from "../../src/kvd/client.ts";
import type { KvdDaemon } from "../../src/kvd/daemon.ts";
import { encodeFrame, HEADER_BYTES, MAGIC, Op } from "../../src/kvd/protocol.ts";
import { bytesFor, MiB, spawnKvd, startTestKvd, tempDir, waitExit } from "./helpers.ts";

/** Sends raw bytes on a fresh connection; resolves with whether the daemon closed it. */
function sendRaw(path: string, bytes: Buffer): Promise<"closed" | "open"> {
  return new Promise((resolve) => {
    const s = net.connect(path, () => s.write(bytes));
    const t = setTimeout(() => {
      s.destroy();
      resolve("open");
    }, 1500);
    s.on("data", () => {});
    s.on("error", () => {});
    s.on("close", () => {
      clearTimeout(t);
      resolve("closed");
    });
  });
}

describe("kvd isolation", () => {
  const tmp = tempDir();
  let kvd: KvdDaemon;
  before(async () => {
    kvd = await startTestKvd(tmp.dir, { ramBytes: 8 * MiB, maxFrameBytes: 4 * MiB });
  });
  after(async () => {
    await kvd.close();
    tmp.cleanup();
  });

  it("a malformed frame closes that connection only", async () => {
    const good = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "m" });
    try {
      await good.put([{ key: "k", data: Buffer.alloc(1000, 1) }]);
      const badMagic = Buffer.alloc(64, 0xab);
      const huge = Buffer.concat(encodeFrame(Op.PUT, 0, 1, { ns: "m" }));
      huge.writeUInt32LE(64 * MiB, 16); // data length beyond --max-frame-bytes
      const badJson = Buffer.alloc(HEADER_BYTES + 5);
      badJson.writeUInt32LE(MAGIC, 0);
      badJson.writeUInt8(Op.GET, 4);
      badJson.writeUInt32LE(5, 12);
      badJson.write("{nope", HEADER_BYTES);
      const badOp = Buffer.concat(encodeFrame(99, 0, 1, {}));
      for (const b of [badMagic, huge, badJson, badOp]) {
        assert.equal(await sendRaw(kvd.socketPath!, b), "closed");
      }
      // A well-formed frame with a wrong schema gets an error answer, the connection stays.
      await assert.rejects(good.request(Op.GET, { ns: "m", keys: "not-a-list" }), (e: KvdRequestError) => {
        assert.equal(e.status, 400);
        assert.equal(e.code, "invalid_meta");
        return true;
      });
      const [b] = await good.getCopy(["k"]);
      assert.ok(b?.equals(Buffer.alloc(1000, 1)), "the daemon and the other connection still work");
    } finally {
      good.close();
    }
  });

  it("another namespace's keys are unreachable", async () => {
    const a = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "tenant-a" });
    const b = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "tenant-b" });
    try {
      await a.put([{ key: "secret", data: bytesFor("secret", 4096) }]);
      assert.deepEqual(await b.getCopy(["secret"]), [null]);
      assert.deepEqual(await b.exists(["secret"]), [null]);
      assert.equal(await b.lookup(["secret"]), 0);
      await assert.rejects(b.getCopy(["secret"], "tenant-a"), (e: KvdRequestError) => {
        assert.equal(e.status, 403);
        assert.equal(e.code, "namespace_forbidden");
        return true;
      });
      await assert.rejects(b.delete(["secret"], "tenant-a"), KvdRequestError);
      assert.deepEqual(await a.exists(["secret"]), ["l2"]);
    } finally {
      a.close();
      b.close();
    }
  });

  it("zero-copy: the client reads the daemon's arena pages through its own mapping", async () => {
    const c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "zc" });
    try {
      await c.put([{ key: "z", data: Buffer.alloc(64 * 1024, 0x11) }]);
      const [g] = await c.get(["z"]);
      assert.ok(g && g.offset >= 0);
      assert.notEqual(g.buf.buffer, kvd.store.l2.arena.buf.buffer, "two distinct mappings");
      assert.equal(g.buf[100], 0x11);
      // The daemon changes the bytes in place; no socket read happens after this.
      kvd.store.l2.arena.buf.fill(0x77, g.offset + 100, g.offset + 200);
      assert.equal(g.buf[100], 0x77, "the change is visible through the client's mapping");
      assert.equal(g.buf[99], 0x11);
      await c.release([g.lease]);
    } finally {
      c.close();
    }
  });
});

describe("kvd zero-copy across processes", () => {
  const tmp = tempDir();
  after(() => tmp.cleanup());

  it("bytes a client writes into its mapping are what the daemon process serves", async () => {
    const sock = join(tmp.dir, "x.sock");
    const child = await spawnKvd(["--socket", sock, "--ram-bytes", "16MiB"], sock);
    const c = await KvdClient.connect({ socketPath: sock, namespace: "x" });
    try {
      await c.put([{ key: "p", data: Buffer.alloc(128 * 1024, 0x22) }]);
      const [g] = await c.get(["p"]);
      assert.ok(g && g.offset >= 0);
      // Write through our mapping only; the daemon's copy-path GET reads its own mapping.
      g.buf.fill(0x5a, 0, 4096);
      const [copy] = await c.getCopy(["p"]);
      assert.equal(copy![0], 0x5a);
      assert.equal(copy![4096], 0x22);
      await c.release([g.lease]);
    } finally {
      c.close();
      child.kill("SIGTERM");
      await waitExit(child);
    }
  });
});
