/**
 * kvd backpressure (issue #17): a client pipelines 300 × (GET of a 1 MiB chunk + PUT of a new
 * 1 MiB chunk) and does not read the replies. Before, the daemon kept reading: every PUT was
 * buffered behind the unsent GET replies and its RSS grew by ~250 MB, never returned. Now a
 * connection is not read while more than --max-queued-bytes (64 MiB default) waits on it.
 * Goals: the daemon's anonymous RSS grows by less than 128 MiB; another client is served
 * meanwhile; once the client reads, every reply arrives in order.
 */
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import { after, test } from "node:test";
import { KvdClient } from "../../src/kvd/client.ts";
import { encodeFrame, type Frame, FrameDecoder, Op } from "../../src/kvd/protocol.ts";
import { waitUntil } from "../helpers/wait.ts";
import { MiB, spawnKvd, tempDir, waitExit } from "../kvd/helpers.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);

const N = 300;
const tmp = tempDir("kvd-bp-");
let child: ChildProcess | undefined;
after(async () => {
  if (child) {
    child.kill("SIGKILL");
    await waitExit(child);
  }
  tmp.cleanup();
  fileDone(import.meta.url);
});

/** The daemon's anonymous (heap) resident memory, bytes; the arena is shared memory and not in it. */
function rssAnon(pid: number): number {
  const m = /RssAnon:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m?.[1] ?? 0) * 1024;
}

test(`a client that never reads ${N} 1 MiB replies does not grow the daemon`, {
  timeout: 120_000,
}, async () => {
  const path = join(tmp.dir, "kvd.sock");
  child = await spawnKvd(["--socket", path, "--ram-bytes", "64MiB", "--ephemeral"], path);
  const pid = child.pid!;

  const sock = net.connect(path);
  await new Promise<void>((r) => sock.once("connect", () => r()));
  const dec = new FrameDecoder(64 * MiB, true);
  const frames: Frame[] = [];
  let reading = true;
  const onData = (d: Buffer) => {
    for (const f of dec.push(d)) frames.push(f);
  };
  sock.on("data", onData);
  const chunk = Buffer.alloc(MiB, 7);
  const w = (parts: Buffer[]) => {
    for (const p of parts) sock.write(p);
  };
  let id = 1;
  w(encodeFrame(Op.HELLO, 0, id++, { namespace: "bp", arena: false }));
  w(encodeFrame(Op.PUT, 0, id++, { items: [{ key: "k0", size: MiB }] }, chunk));
  await waitUntil(() => frames.length === 2, 10_000, "HELLO and the first PUT answered");
  await new Promise((r) => setTimeout(r, 300));
  const base = rssAnon(pid);

  // Stop reading: the replies back up in the daemon's socket.
  sock.pause();
  reading = false;
  for (let i = 0; i < N; i++) {
    w(encodeFrame(Op.GET, 0, id++, { keys: ["k0"], copy: true }));
    w(encodeFrame(Op.PUT, 0, id++, { items: [{ key: `k${i + 1}`, size: MiB }] }, chunk));
  }
  // Let the daemon take whatever it will take (until it has read nothing more for 1 s), sampling
  // its RSS meanwhile. Another connection is served all along.
  const other = await KvdClient.connect({ socketPath: path, namespace: "bp", arena: false });
  const readBytes = async () => {
    const r = (await other.request(Op.STATS, {})).meta.socket_reads as Record<string, number>;
    return r.into_reservation_bytes! + r.copied_bytes!;
  };
  let peak = base;
  let maxOtherMs = 0;
  let read = await readBytes();
  // Each probe's own STATS request is read by the daemon too (through the staging buffer, so
  // counted in copied_bytes): a probe that finds no more than its own frame read means the
  // stuck connection was not read. (Comparing totals for equality never held, so the loop ran
  // to its 30 s cap every time.)
  const probe = encodeFrame(Op.STATS, 0, 1, {}).reduce((n, p) => n + p.length, 0);
  for (let stable = 0, t = Date.now(); stable < 5 && Date.now() - t < 30_000; ) {
    await new Promise((r) => setTimeout(r, 200));
    peak = Math.max(peak, rssAnon(pid));
    const t0 = Date.now();
    const now = await readBytes();
    maxOtherMs = Math.max(maxOtherMs, Date.now() - t0);
    stable = now - read <= probe ? stable + 1 : 0;
    read = now;
  }
  const sent = 2 * MiB + N * (MiB + 200);
  other.close();

  // Now read: every reply arrives, in request order.
  reading = true;
  sock.resume();
  await waitUntil(() => frames.length === 2 + 2 * N, 60_000, "all replies", 50);
  const ordered = frames.every((f, i) => f.id === i + 1);
  const stored = frames.filter((f) => f.op === Op.PUT && (f.meta.stored as boolean[])?.[0] === true).length;
  sock.destroy();
  const growth = peak - base;

  const pass = record(
    import.meta.url,
    "kvd: client not reading 300 × 1 MiB replies",
    `daemon RssAnon +${(growth / MiB).toFixed(0)} MiB at peak (was ~250 MB before backpressure); it read ${(read / MiB).toFixed(0)} of ${(sent / MiB).toFixed(0)} MiB sent while replies waited; other client answered within ${maxOtherMs} ms; ${frames.length - 2}/${2 * N} replies in order after reading, ${stored - 1}/${N} PUTs stored`,
    "growth < 128 MiB, all replies in order",
    growth < 128 * MiB && ordered && reading,
  );
  assert.ok(pass);
  assert.ok(read < sent / 2, "the daemon stopped reading the connection");
});
