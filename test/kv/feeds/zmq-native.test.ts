/**
 * The native SUB reader (src/kv/feeds/zmq-native.ts) against zeromq.js' reader: the same
 * vLLM-framed stream, the same outcome. Frames follow vLLM's ZmqEventPublisher
 * (vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34:
 * `send_multipart((topic, seq.to_bytes(8, "big"), payload))`, replay over a ROUTER).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { Registry } from "prom-client";
import { XPublisher } from "zeromq";
import { encodeSeq } from "../../../src/kv/events.ts";
import { FdWatcher, ThreadFdWatcher } from "../../../src/kv/feeds/fd-watcher.ts";
import { LoopFdWatcher } from "../../../src/kv/feeds/loop-fd-watcher.ts";
import type { KvZmqReader } from "../../../src/kv/feeds/types.ts";
import { ZmqKvFeed } from "../../../src/kv/feeds/zmq.ts";
import { loadNativeZmq, NativeSub } from "../../../src/kv/feeds/zmq-native.ts";
import { KvIndex } from "../../../src/kv/index.ts";
import { KvIngestMetrics } from "../../../src/kv/metrics.ts";
import { createLogger } from "../../../src/util/log.ts";
import { storedWire } from "../../helpers/kv-events.ts";
import { freePort } from "../../helpers/ports.ts";
import { FakePublisher, waitFor } from "../fake-publisher.ts";

const BS = 4;
const logger = createLogger("test", {});
logger.level = "silent";
const toks = (n: number, base: number) => Array.from({ length: n }, (_, i) => base + i);
// INFERA_KV_ZMQ_NATIVE=0 turns the native reader off (zeromq.js is then the only one).
const native = process.platform === "linux" && process.env.INFERA_KV_ZMQ_NATIVE !== "0";

const closers: (() => Promise<void> | void)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

function subscriber(
  pub: FakePublisher,
  reader: KvZmqReader,
  index: KvIndex,
  metrics?: KvIngestMetrics,
): ZmqKvFeed {
  const sub = new ZmqKvFeed({
    workerId: "w",
    events: { endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint, topic: pub.topic, framing: "seq" },
    blockSize: BS,
    index,
    logger,
    reader,
    replayTimeoutMs: 1000,
    metrics,
  });
  sub.start();
  closers.push(() => sub.close());
  return sub;
}

test("the native reader is the default on Linux and reads a burst of 3,000 in order", {
  skip: !native,
}, async () => {
  const pub = new FakePublisher();
  await pub.start();
  closers.push(() => pub.close());
  const index = new KvIndex();
  const metrics = new KvIngestMetrics(new Registry());
  const sub = subscriber(pub, "native", index, metrics);
  assert.equal(sub.reader, "native");
  const dflt = new ZmqKvFeed({
    workerId: "d",
    events: { endpoint: pub.endpoint, topic: pub.topic, framing: "seq" },
    blockSize: BS,
    index: new KvIndex(),
    logger,
  });
  dflt.start();
  closers.push(() => dflt.close());
  assert.equal(dflt.reader, "native");
  await sub.synced;
  await pub.subscribed(); // the SUB's subscription has reached the PUB
  const n = 3000;
  for (let i = 0; i < n; i++) await pub.publish([storedWire([10_000 + i], null, toks(4, 4 * i), BS)]);
  await waitFor(() => sub.stats.lastSeq === n - 1, 10_000, "every batch applied");
  assert.equal(sub.stats.batches, n);
  assert.equal(sub.stats.gaps, 0);
  assert.equal(sub.stats.malformed, 0);
  assert.equal(index.blockCount("w"), n);
  // Counted in bulk (KvIngestMetrics.applied), exact whenever read.
  assert.deepEqual(
    (await metrics.batches.get()).values.map((v) => [v.labels.worker, v.value]),
    [["w", n]],
  );
  assert.deepEqual(
    (await metrics.events.get()).values.map((v) => [v.labels.type, v.value]),
    [["BlockStored", n]],
  );
});

test("both readers agree: gap filled by replay, malformed frames, a message of 5 frames, a restart", async () => {
  const pub = new FakePublisher();
  await pub.start();
  closers.push(() => pub.close());
  const readers: KvZmqReader[] = native ? ["native", "zeromq"] : ["zeromq"];
  const runs = readers.map((r) => {
    const index = new KvIndex();
    return { index, sub: subscriber(pub, r, index) };
  });
  for (const r of runs) await r.sub.synced;
  await pub.subscribed(runs.length);
  const p = toks(16, 7000);
  await pub.publish([storedWire([1], null, p.slice(0, 4), BS)]); // seq 0
  await pub.publish([storedWire([2], 1, p.slice(4, 8), BS)], { drop: true }); // seq 1, missed live
  await pub.publish([storedWire([3], 2, p.slice(8, 12), BS)]); // seq 2: a gap, replayed
  await pub.sendRaw([pub.topic, Buffer.alloc(3), Buffer.from([0x90])]); // a 3-byte seq frame
  await pub.sendRaw([pub.topic, encodeSeq(99), Buffer.alloc(1), Buffer.alloc(1), Buffer.alloc(1)]);
  await pub.publish([storedWire([4], 3, p.slice(12, 16), BS)]); // seq 3
  for (const r of runs) await waitFor(() => r.sub.stats.lastSeq === 3, 5000, "seq 3 applied");
  // The engine restarts and numbers from 0 again: a backward live seq.
  await pub.resend(0);
  for (const r of runs) await waitFor(() => r.sub.stats.restarts === 1, 5000, "restart seen");
  for (const r of runs) await waitFor(() => r.sub.stats.lastSeq === 3, 5000, "rebuilt by replay");
  const [a, b] = runs;
  for (const r of runs) {
    assert.equal(r.sub.stats.gaps, 1);
    assert.equal(r.sub.stats.malformed, 2);
    assert.equal(r.index.overlaps(p, ["w"])[0], 4);
  }
  if (b) {
    const strip = (s: ZmqKvFeed["stats"]) => ({ ...s, syncMs: 0 });
    assert.deepEqual(strip(a.sub.stats), strip(b.sub.stats));
  }
});

/**
 * An XPUB (a PUB to the SUB) that shows when the subscription has arrived — sent before that,
 * messages would be dropped (ZMQ's slow joiner; see FakePublisher.subscribed()) — and a
 * NativeSub on topic "t" connected to it through `z`.
 */
async function pubAndSub(z: NonNullable<ReturnType<typeof loadNativeZmq>>) {
  const endpoint = `tcp://127.0.0.1:${await freePort()}`;
  const pub = new XPublisher({ linger: 0 });
  await pub.bind(endpoint);
  closers.push(() => pub.close());
  const sub = new NativeSub(z, endpoint, "t");
  closers.push(() => sub.close());
  return { pub, sub };
}

test("NativeSub reads whole messages, counts frames past four, and resumes at the next message", {
  skip: !native,
}, async () => {
  const z = loadNativeZmq();
  assert.ok(z, "libzmq's C API loads on Linux");
  const { pub, sub } = await pubAndSub(z);
  const [subscription] = await pub.receive();
  assert.equal(subscription?.toString(), "\x01t", "the SUB's subscription to topic t");
  await pub.send(["t", "a", "b", "c", "d", "e"]);
  await pub.send(["t", "x", Buffer.alloc(70_000, 7)]);
  await pub.send(["other-topic", "y"]);
  await pub.send(["t"]);
  const got: { count: number; frames: number[][] }[] = [];
  await waitFor(
    () => {
      for (let f = sub.read(); f; f = sub.read())
        got.push({ count: f.count, frames: f.views.map((v) => [...v.subarray(0, 2)]) });
      return got.length === 3;
    },
    3000,
    "three messages",
  );
  assert.deepEqual(
    got.map((g) => g.count),
    [6, 3, 1],
  );
  assert.equal(got[0].frames.length, 4); // views of the first four frames only
  assert.deepEqual(got[1].frames[2], [7, 7]);
  assert.equal(sub.read(), null);
});

test("NativeSub connects again when a signal interrupts zmq_connect (EINTR)", {
  skip: !native,
}, async () => {
  // libzmq's zmq_connect fails with EINTR when a signal (the profiler's SIGPROF under
  // --cpu-prof) lands in its process_commands, before it has done anything (zeromq/libzmq
  // src/socket_base.cpp connect_internal @ 45501798a230d862c3e0f3fa77324452a56c1d5f): the call
  // is to be made again, not the subscriber stopped. Here the first TCP connect reports EINTR.
  const real = loadNativeZmq();
  assert.ok(real);
  const EINTR = 4;
  let interrupted = 0;
  let lastWasFake = false;
  const z: typeof real = {
    ...real,
    connect: (s, ep) => {
      if (ep.startsWith("tcp://") && interrupted === 0) {
        interrupted++;
        lastWasFake = true;
        return -1;
      }
      lastWasFake = false;
      return real.connect(s, ep);
    },
    errno: () => (lastWasFake ? EINTR : real.errno()),
  };
  const { pub, sub } = await pubAndSub(z);
  assert.equal(interrupted, 1);
  const [subscription] = await pub.receive();
  assert.equal(subscription?.toString(), "\x01t", "connected after the interrupted call");
  await pub.send(["t", "a"]);
  await waitFor(() => sub.read()?.count === 2, 3000, "the message");
});

for (const kind of ["loop", "thread"] as const)
  test(`the fd watcher (${kind}) reports every arrival on 200 sockets, one message at a time and in bursts`, {
    skip: !native,
  }, async () => {
    // The watcher (edge-triggered epoll over each socket's ZMQ_FD) must report a socket again
    // after each drain that found it empty, also when the message arrives while the main thread
    // is still busy (a drain in progress, other work): a lost report would stall that worker's
    // KV events for good. Sparse traffic over many sockets is the fleet's usual shape.
    const z = loadNativeZmq();
    assert.ok(z);
    // "loop": the process's watcher, which on Linux's main thread is the one on Node's own loop
    // (src/kv/feeds/loop-fd-watcher.ts); "thread": the worker-thread watcher it replaced.
    const watcher = kind === "loop" ? FdWatcher.get(z) : new ThreadFdWatcher(z);
    if (kind === "loop") assert.ok(watcher instanceof LoopFdWatcher, "the loop watcher is the one in use");
    const dir = mkdtempSync(join(tmpdir(), "fd-watcher-"));
    closers.push(() => rmSync(dir, { recursive: true, force: true }));
    const n = 200;
    const pubs: XPublisher[] = [];
    const subs: NativeSub[] = [];
    const got = new Array<number>(n).fill(0);
    for (let i = 0; i < n; i++) {
      const pub = new XPublisher({ linger: 0 });
      await pub.bind(`ipc://${join(dir, `p${i}`)}`);
      pubs.push(pub);
      const sub = new NativeSub(z, `ipc://${join(dir, `p${i}`)}`, "t");
      subs.push(sub);
      watcher.watch(sub.fd, () => {
        while (sub.read()) got[i]++;
      });
    }
    closers.push(() => {
      for (const s of subs) {
        watcher.unwatch(s.fd);
        s.close();
      }
      for (const p of pubs) p.close();
    });
    await Promise.all(pubs.map((p) => p.receive())); // every subscription has arrived
    const sent = new Array<number>(n).fill(0);
    let seed = 7;
    const rnd = () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return seed % n;
    };
    for (let round = 0; round < 40; round++) {
      // One message to each of a few sockets, then a burst to one, then the main thread busy for
      // 3 ms while more arrive (their reports queue up behind it).
      for (let k = 0; k < 10; k++) {
        const i = rnd();
        await pubs[i].send(["t", "x"]);
        sent[i]++;
      }
      const b = rnd();
      for (let k = 0; k < 20; k++) await pubs[b].send(["t", "y"]);
      sent[b] += 20;
      const until = performance.now() + 3;
      while (performance.now() < until) {
        // busy
      }
      await new Promise((r) => setTimeout(r, round % 3));
    }
    const total = sent.reduce((a, b) => a + b, 0);
    await waitFor(() => got.reduce((a, b) => a + b, 0) >= total, 5000, `${total} messages`);
    assert.deepEqual(got, sent);
    // Quiet, then one more message to each socket: each is reported again.
    await new Promise((r) => setTimeout(r, 50));
    for (const p of pubs) await p.send(["t", "z"]);
    await waitFor(() => got.every((g, i) => g === sent[i] + 1), 5000, "one more on each socket");
  });

test("the loop fd watcher serves only the main thread and never keeps a process alive", {
  skip: !native,
}, async () => {
  // A process that watches a socket and has nothing else to do must exit (the uv_poll_t is
  // unref'd, as the thread's Worker is); in a worker thread the default loop is not its own,
  // so no loop watcher is made there (the thread watcher serves it).
  const { spawnSync } = await import("node:child_process");
  const { pathToFileURL } = await import("node:url");
  const src = (p: string) => pathToFileURL(join(import.meta.dirname, "../../../src/kv/feeds", p)).href;
  const script = `
    import { Worker } from "node:worker_threads";
    import { FdWatcher } from ${JSON.stringify(src("fd-watcher.ts"))};
    import { LoopFdWatcher } from ${JSON.stringify(src("loop-fd-watcher.ts"))};
    import { loadNativeZmq, NativeSub } from ${JSON.stringify(src("zmq-native.ts"))};
    const z = loadNativeZmq();
    const sub = new NativeSub(z, "tcp://127.0.0.1:9", "t");
    const w = FdWatcher.get(z);
    w.watch(sub.fd, () => { while (sub.read()) {} });
    const inWorker = await new Promise((resolve, reject) => {
      const t = new Worker(
        "Promise.all([import(" + JSON.stringify(${JSON.stringify(src("loop-fd-watcher.ts"))}) + "), import('node:worker_threads')]).then(([m, wt]) => wt.parentPort.postMessage(m.LoopFdWatcher.create() === null))",
        { eval: true },
      );
      t.once("message", resolve);
      t.once("error", reject);
    });
    console.log(JSON.stringify({ loop: w instanceof LoopFdWatcher, nullInWorker: inWorker }));
  `;
  const started = performance.now();
  const out = spawnSync(process.execPath, ["--input-type=module", "-e", script], {
    encoding: "utf8",
    timeout: 20_000,
  });
  assert.equal(out.status, 0, out.stderr);
  assert.deepEqual(JSON.parse(out.stdout.trim().split("\n").pop() ?? "{}"), {
    loop: true,
    nullInWorker: true,
  });
  // Exits at once, not at the 20 s bound (nor after any epoll timeout).
  assert.ok(performance.now() - started < 10_000);
});
