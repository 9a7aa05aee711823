/**
 * The daemon's fast path for a one-item PUT received into its arena reservation: the meta is
 * checked by hand (not zod) before reserving, and the answer is written from the read
 * callback without a promise per frame. It must accept exactly what the schema accepts
 * (anything odd takes the ordinary path and gets the ordinary answer), and answers must
 * still leave in request order when other ops are queued ahead of it.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { KvdClient, KvdRequestError } from "../../src/kvd/client.ts";
import type { KvdDaemon } from "../../src/kvd/daemon.ts";
import { Op } from "../../src/kvd/protocol.ts";
import { bytesFor, MiB, startTestKvd, tempDir } from "./helpers.ts";

const sunkBytes = async (c: KvdClient) =>
  ((await c.stats()).socket_reads as { into_reservation_bytes: number }).into_reservation_bytes;

describe("kvd sunk PUT fast path", () => {
  const tmp = tempDir();
  let kvd: KvdDaemon;
  let c: KvdClient;
  before(async () => {
    kvd = await startTestKvd(tmp.dir, { ramBytes: 32 * MiB });
    c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "fast" });
  });
  after(async () => {
    c.close();
    await kvd.close();
    tmp.cleanup();
  });

  it("valid variants of the one-item meta are received into the reservation and stored", async () => {
    const variants: Record<string, unknown>[] = [
      { items: [{ key: "v0", size: 0 }] },
      { ns: "fast", items: [{ key: "v1", size: 0, retention: "short" }] },
      { items: [{ key: "v2", size: 0 }], retention: "long", ttl_ms: 60_000 },
      { items: [{ key: "v3", size: 0, ttl_ms: 0, extra: "ignored" }] },
    ];
    for (const [i, meta] of variants.entries()) {
      const data = bytesFor(`v${i}`, 256 * 1024 + i);
      (meta.items as { size: number }[])[0]!.size = data.length;
      const before = await sunkBytes(c);
      const f = await c.request(Op.PUT, meta, data);
      assert.deepEqual(f.meta.stored, [true], `variant ${i}`);
      assert.ok((await sunkBytes(c)) - before >= data.length / 2, `variant ${i} was not sunk`);
      const [got] = await c.getCopy([`v${i}`]);
      assert.ok(got?.equals(data), `variant ${i} bytes`);
    }
  });

  it("meta the schema refuses gets the schema's 400, stores nothing, and the connection carries on", async () => {
    const data = bytesFor("bad", 256 * 1024);
    const bad: Record<string, unknown>[] = [
      { items: [{ key: "b0", size: data.length, retention: "forever" }] },
      { items: [{ key: "b1", size: data.length, ttl_ms: -1 }] },
      { items: [{ key: "b2", size: data.length, retention: null }] },
      { items: [{ key: "", size: data.length }] },
      { items: [{ key: "b4", size: data.length }], ns: "" },
      { items: [{ key: "b5", size: data.length }], retention: 3 },
      { items: [{ key: "b6", size: String(data.length) }] },
    ];
    for (const [i, meta] of bad.entries()) {
      await assert.rejects(
        c.request(Op.PUT, meta, data),
        (e: unknown) => e instanceof KvdRequestError && e.status === 400,
        `bad meta ${i}`,
      );
    }
    assert.deepEqual(await c.exists(["b0", "b1", "b2", "b4", "b5", "b6"]), [
      null,
      null,
      null,
      null,
      null,
      null,
    ]);
    // Another namespace than the bound one: 403 through the ordinary path.
    await assert.rejects(
      c.request(Op.PUT, { ns: "other", items: [{ key: "n", size: data.length }] }, data),
      (e: unknown) => e instanceof KvdRequestError && e.status === 403,
    );
    assert.deepEqual(await c.put([{ key: "after", data }]), [true]);
  });

  it("answers leave in request order when sunk PUTs follow queued ops", async () => {
    const order: string[] = [];
    const pending: Promise<unknown>[] = [];
    for (let i = 0; i < 24; i++) {
      const tag = `o${i}`;
      const p =
        i % 3 === 0
          ? c.lookup([`o${i - 1}`, "absent"])
          : i % 3 === 1
            ? c.put([{ key: tag, data: bytesFor(tag, 300 * 1024 + i), retention: "short" }])
            : c.getCopy([`o${i - 1}`]);
      pending.push(p.then(() => order.push(tag)));
    }
    await Promise.all(pending);
    assert.deepEqual(
      order,
      Array.from({ length: 24 }, (_, i) => `o${i}`),
    );
  });
});
