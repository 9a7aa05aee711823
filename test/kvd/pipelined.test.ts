/**
 * The daemon's socket read path under pipelining: many large PUTs (each spanning many socket
 * reads, received straight into their arena reservations) interleaved with small frames on one
 * connection, none awaited before the next is sent, so reads mix the tail of one frame with
 * the head of the next. Every chunk is then read back and compared byte for byte. A connection
 * closed in the middle of a PUT must leave nothing readable under that key.
 *
 * Run against both read paths: the direct one (kernel → reservation) and the ordinary 'data'
 * one it falls back to; STATS proves which path actually carried the bytes. Once more against
 * `infera kvd` as its own process, i.e. whatever bin/infera.js runs (the dist/ bundle when it
 * is fresh, else the sources through tsx), so a build that loses the direct path fails here.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import net from "node:net";
import { after, before, describe, it } from "node:test";
import { KvdClient } from "../../src/kvd/client.ts";
import type { KvdDaemon } from "../../src/kvd/daemon.ts";
import { encodeFrame, Op } from "../../src/kvd/protocol.ts";
import { bytesFor, MiB, spawnKvd, startTestKvd, tempDir, waitExit } from "./helpers.ts";

interface SocketReads {
  direct_connections: number;
  data_event_connections: number;
  into_reservation_bytes: number;
  copied_bytes: number;
}

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");

async function socketReads(c: KvdClient): Promise<SocketReads> {
  return (await c.stats()).socket_reads as SocketReads;
}

/** Large sizes that are not multiples of a read: frame boundaries land mid-read. */
const bigSize = (i: number) => 2 * MiB + ((i * 7919) % 3000) * 1024 + (i % 7) * 13;

/**
 * Sends the whole mix on one connection without awaiting, then awaits every answer. Returns
 * the keys stored and their checksums, and the bytes of large PUT data sent.
 */
async function pipelinedMix(c: KvdClient, tag: string, rounds: number) {
  const want = new Map<string, string>();
  const pending: Promise<unknown>[] = [];
  let bigBytes = 0;
  for (let i = 0; i < rounds; i++) {
    const big = `${tag}-big-${i}`;
    const bigData = bytesFor(big, bigSize(i));
    bigBytes += bigData.length;
    want.set(big, sha(bigData));
    pending.push(c.put([{ key: big, data: bigData }]).then((s) => assert.deepEqual(s, [true], big)));
    if (i % 4 === 3) {
      // The same key again while the first may not be committed yet: both reserve, one wins.
      pending.push(
        c.put([{ key: big, data: bigData }]).then((s) => assert.deepEqual(s, [true], `${big} again`)),
      );
    }
    // Small PUT (below the sink threshold: copied by the decoder).
    const small = `${tag}-small-${i}`;
    const smallData = bytesFor(small, 100 + i * 37);
    want.set(small, sha(smallData));
    pending.push(c.put([{ key: small, data: smallData }]).then((s) => assert.deepEqual(s, [true], small)));
    // Multi-item PUT (never sunk), large enough to span reads.
    const multi = [0, 1].map((j) => `${tag}-multi-${i}-${j}`);
    const multiData = multi.map((k, j) => bytesFor(k, 150 * 1024 + j * 777));
    for (const [j, k] of multi.entries()) want.set(k, sha(multiData[j]!));
    pending.push(
      c
        .put(multi.map((k, j) => ({ key: k, data: multiData[j]! })))
        .then((s) => assert.deepEqual(s, [true, true], multi.join())),
    );
    // Frames without data, and GETs of what this very pipeline stored a moment ago.
    pending.push(c.exists([big, small]).then((t) => assert.deepEqual(t, ["l2", "l2"], `exists ${big}`)));
    pending.push(c.lookup([big, small, "absent"]).then((n) => assert.equal(n, 2)));
    pending.push(
      c.getCopy([big, small]).then(([b, s]) => {
        assert.equal(b && sha(b), want.get(big), `pipelined GET of ${big}`);
        assert.equal(s && sha(s), want.get(small), `pipelined GET of ${small}`);
      }),
    );
    // GET into a caller-owned buffer (larger than the chunk, filled with junk first): the
    // client may read these bytes straight into it.
    const dest = Buffer.alloc(bigData.length + 4096, 0xee);
    pending.push(
      c.getCopyInto(big, dest).then((n) => {
        assert.equal(n, bigData.length, `getCopyInto size of ${big}`);
        assert.equal(sha(dest.subarray(0, n)), want.get(big), `getCopyInto of ${big}`);
        assert.ok(
          dest.subarray(n).every((x) => x === 0xee),
          "nothing written past the chunk",
        );
      }),
    );
  }
  await Promise.all(pending);
  return { want, bigBytes };
}

async function verifyAll(c: KvdClient, want: Map<string, string>): Promise<void> {
  const keys = [...want.keys()];
  for (let i = 0; i < keys.length; i += 16) {
    const batch = keys.slice(i, i + 16);
    const got = await c.getCopy(batch);
    got.forEach((b, j) => {
      assert.ok(b, `${batch[j]} is missing`);
      assert.equal(sha(b), want.get(batch[j]!), `${batch[j]} has wrong bytes`);
    });
  }
}

/** Writes `bytes` on a raw connection, then closes it; resolves once the daemon saw it go. */
function sendThenClose(path: string, bytes: Buffer, how: "destroy" | "end"): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = net.connect(path, () => {
      s.write(bytes, () => {
        if (how === "end") s.end();
        else s.destroy();
      });
    });
    s.on("data", () => {});
    s.on("error", reject);
    s.on("close", () => resolve());
  });
}

async function waitClients(c: KvdClient, n: number): Promise<void> {
  const deadline = Date.now() + 5000;
  while ((await c.stats()).clients !== n) {
    if (Date.now() > deadline) throw new Error(`daemon still counts ${(await c.stats()).clients} clients`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

for (const directRead of [true, false]) {
  describe(`kvd pipelined socket reads (${directRead ? "direct into reservations" : "'data' fallback"})`, () => {
    const tmp = tempDir();
    let kvd: KvdDaemon;
    before(async () => {
      kvd = await startTestKvd(tmp.dir, {
        ramBytes: 160 * MiB,
        diskBytes: 256 * MiB,
        directRead,
        tcp: { host: "127.0.0.1", port: 0 },
      });
    });
    after(async () => {
      await kvd.close();
      tmp.cleanup();
    });

    it("pipelined large and small frames per connection, one Unix-socket and one TCP connection at once: every byte intact", async () => {
      const a = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "p", directRead });
      // Over TCP too (no arena; HELLO goes through the client's own read path).
      const b = await KvdClient.connect({
        tcp: { host: "127.0.0.1", port: kvd.tcpPort! },
        namespace: "p",
        directRead,
      });
      try {
        const before0 = await socketReads(a);
        const [ra, rb] = await Promise.all([pipelinedMix(a, "a", 12), pipelinedMix(b, "b", 6)]);
        const want = new Map([...ra.want, ...rb.want]);
        await verifyAll(a, want);
        const st = await socketReads(a);
        if (directRead) {
          assert.equal(st.data_event_connections, 0, "no connection fell back to 'data' events");
          assert.ok(st.direct_connections >= 2);
          // The decoder may copy the first bytes of a PUT's data that shared a read with its
          // header; all the rest must have been read straight into the reservation.
          const sunk = st.into_reservation_bytes - before0.into_reservation_bytes;
          assert.ok(
            sunk >= 0.9 * (ra.bigBytes + rb.bigBytes),
            `only ${sunk} of ${ra.bigBytes + rb.bigBytes} large-PUT bytes were read into reservations`,
          );
          // Same on the client side for the getCopyInto answers (one per large PUT).
          for (const [c, r] of [
            [a, ra],
            [b, rb],
          ] as const) {
            assert.equal(c.readStats.directConnections, 1, "the client fell back to 'data' events");
            assert.ok(c.readStats.intoSinkBytes >= 0.9 * r.bigBytes, `client: ${c.readStats.intoSinkBytes}`);
          }
        } else {
          assert.equal(st.direct_connections, 0);
          assert.equal(st.into_reservation_bytes, 0);
          assert.equal(a.readStats.dataEventConnections, 1);
          assert.equal(a.readStats.intoSinkBytes, 0);
        }
      } finally {
        a.close();
        b.close();
      }
    });

    it("a connection closed mid-PUT leaves no readable partial chunk, and its space is freed", async () => {
      const c = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "cut", arena: false });
      try {
        await waitClients(c, 1);
        const used0 = ((await c.stats()).tiers as { l2: { allocated_bytes: number } }).l2.allocated_bytes;
        const size = 3 * MiB + 5;
        const cuts = [
          { key: "cut-early", sent: 64 * 1024 + 17, how: "destroy" as const },
          { key: "cut-late", sent: size - 1, how: "destroy" as const },
          { key: "cut-half", sent: Math.floor(size / 2), how: "end" as const },
          { key: "cut-header", sent: -1, how: "end" as const },
        ];
        for (const cut of cuts) {
          const data = bytesFor(cut.key, size);
          const hello = Buffer.concat(encodeFrame(Op.HELLO, 0, 1, { namespace: "cut", arena: false }));
          const put = Buffer.concat(
            encodeFrame(Op.PUT, 0, 2, { items: [{ key: cut.key, size }] }, data.subarray(0, size)),
          );
          // A small frame first, so the cut PUT starts mid-read, as in real traffic.
          const small = Buffer.concat(encodeFrame(Op.EXISTS, 0, 3, { keys: ["x"] }));
          const upTo = cut.sent < 0 ? 11 : 20 + put.readUInt32LE(12) + cut.sent;
          await sendThenClose(kvd.socketPath!, Buffer.concat([hello, small, put.subarray(0, upTo)]), cut.how);
        }
        // The daemon notices each close (also a half-close without any 'data' listener).
        await waitClients(c, 1);
        for (const cut of cuts) {
          assert.deepEqual(await c.exists([cut.key]), [null], `${cut.key} exists`);
          assert.deepEqual(await c.getCopy([cut.key]), [null], `${cut.key} is readable`);
        }
        const used1 = ((await c.stats()).tiers as { l2: { allocated_bytes: number } }).l2.allocated_bytes;
        assert.equal(used1, used0, "the cut PUTs' reservations were released");
        // The same key can then be stored whole and reads back exactly.
        const whole = bytesFor("cut-late", 3 * MiB + 5);
        assert.deepEqual(await c.put([{ key: "cut-late", data: whole }]), [true]);
        const [got] = await c.getCopy(["cut-late"]);
        assert.equal(got && sha(got), sha(whole));
      } finally {
        c.close();
      }
    });
  });
}

describe("kvd pipelined socket reads (`infera kvd` process)", () => {
  const tmp = tempDir();
  after(() => tmp.cleanup());

  it("takes the direct path and keeps every byte", { timeout: 60_000 }, async () => {
    const sock = `${tmp.dir}/kvd.sock`;
    const child = await spawnKvd(["--socket", sock, "--ram-bytes", "96MiB"], sock);
    const c = await KvdClient.connect({ socketPath: sock, namespace: "p" }).catch((e: Error) => {
      child.kill("SIGKILL");
      throw e;
    });
    try {
      const { want, bigBytes } = await pipelinedMix(c, "proc", 8);
      await verifyAll(c, want);
      const st = await socketReads(c);
      assert.equal(st.data_event_connections, 0, "the daemon process fell back to 'data' events");
      assert.ok(st.into_reservation_bytes >= 0.9 * bigBytes, `${st.into_reservation_bytes} of ${bigBytes}`);
      assert.equal(c.readStats.directConnections, 1, "the client fell back to 'data' events");
    } finally {
      c.close();
      child.kill("SIGTERM");
      await waitExit(child);
    }
  });
});
