/**
 * The sim's io_uring SSE writer against real TCP sockets: bytes arrive complete and in order,
 * mixed with Node's own writes, through a full socket (EAGAIN → Node's queue), and a sim
 * streaming through it answers exactly as one writing through Node.
 */
import assert from "node:assert/strict";
import { closeSync, openSync } from "node:fs";
import { connect, createServer, type Server, type Socket } from "node:net";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { UringWriter } from "../../../src/engine/sim/uring-writer.ts";
import { type SimProcess, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";

const writer = UringWriter.create(8, 64 * 1024);
const skip = writer === null ? "io_uring is not available on this machine" : false;

/** N connected pairs: `out` (written by the test) → `in` (collected by the server side). */
async function pairs(n: number): Promise<{ server: Server; out: Socket[]; got: Buffer[][]; ins: Socket[] }> {
  const ins: Socket[] = [];
  const got: Buffer[][] = [];
  const server = createServer((s) => {
    const i = ins.length;
    ins.push(s);
    got.push([]);
    s.on("data", (c: Buffer) => got[i].push(c));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  const out: Socket[] = [];
  for (let i = 0; i < n; i++) {
    const s = connect(port, "127.0.0.1");
    await new Promise<void>((r) => s.once("connect", r));
    await waitUntil(async () => ins.length === i + 1, 2000, "accepted");
    out.push(s);
  }
  return { server, out, got, ins };
}

const text = (b: Buffer[]): string => Buffer.concat(b).toString("utf8");

describe("UringWriter (io_uring batch sends)", { skip }, () => {
  it("one flush delivers every socket's bytes, more sockets than ring entries, UTF-8 included", async () => {
    const w = writer!;
    const p = await pairs(20);
    const want: string[] = [];
    for (let round = 0; round < 3; round++) {
      p.out.forEach((s, i) => {
        const chunk = `event ${round} for ${i} ${"é".repeat(i % 3)}|`;
        want[i] = (want[i] ?? "") + chunk;
        assert.equal(w.add(s, chunk, Buffer.byteLength(chunk) === chunk.length), true);
      });
      w.flush();
    }
    await waitUntil(async () => p.got.every((g, i) => text(g) === want[i]), 3000, "all bytes arrived");
    assert.ok(w.stats.batches >= 6, "20 sockets in a ring of 8 take several batches");
    for (const s of p.out) s.destroy();
    p.server.close();
  });

  it("keeps order with Node's writes: a socket with bytes queued in Node is refused, then taken again", async () => {
    const w = writer!;
    const p = await pairs(1);
    const s = p.out[0];
    s.cork();
    s.write("A");
    assert.equal(w.add(s, "B", true), false, "Node has 'A' queued: the writer must not pass it");
    s.write("B");
    s.uncork();
    await waitUntil(async () => s.writableLength === 0, 2000, "Node drained");
    assert.equal(w.add(s, "C", true), true);
    w.flush();
    await waitUntil(async () => text(p.got[0]) === "ABC", 2000, "ABC in order");
    s.destroy();
    assert.equal(w.add(s, "D", true), false, "a destroyed socket is refused");
    p.server.close();
  });

  it("a connection the peer reset is closed, as a failed Node write would close it", async () => {
    const w = writer!;
    const p = await pairs(1);
    const s = p.out[0];
    let closed = false;
    s.on("close", () => {
      closed = true;
    });
    p.ins[0].resetAndDestroy(); // RST now, before this side's loop has seen it
    const before = w.stats.fallbacks;
    assert.equal(w.add(s, "after the reset", true), true);
    w.flush();
    assert.equal(w.stats.fallbacks, before + 1);
    assert.equal(s.destroyed, true);
    await waitUntil(async () => closed, 2000, "'close' emitted");
    p.server.close();
  });

  it("an operation the kernel refuses (not a socket) goes through Node and turns the writer off", () => {
    const own = UringWriter.create(4, 4096)!;
    const fd = openSync("/dev/null", "w");
    const written: string[] = [];
    let destroyed = false;
    const fake = {
      writableLength: 0,
      destroyed: false,
      _handle: { fd },
      write: (b: Buffer) => written.push(b.toString()),
      destroy: () => {
        destroyed = true;
      },
    } as unknown as Socket;
    try {
      assert.equal(own.add(fake, "not sent by the ring", true), true);
      own.flush();
      assert.deepEqual(written, ["not sent by the ring"], "the bytes went through the socket's own write");
      assert.equal(destroyed, false);
      assert.equal(own.enabled, false);
      assert.equal(own.add(fake, "later", true), false, "and everything after");
    } finally {
      closeSync(fd);
      own.close();
    }
  });

  it("a full socket: what the kernel does not take goes through Node, in order, nothing lost", async () => {
    const w = writer!;
    const p = await pairs(1);
    const s = p.out[0];
    p.ins[0].pause(); // the receiver stops reading: its window and our send buffer fill up
    // 19 MB: past what loopback's autotuned send + receive buffers hold.
    const piece = "x".repeat(48 * 1024);
    let sent = "";
    for (let i = 0; i < 400; i++) {
      const chunk = `${i}:${piece}|`;
      sent += chunk;
      if (!w.add(s, chunk, true)) s.write(chunk);
      w.flush();
    }
    assert.ok(w.stats.fallbacks + w.stats.partial > 0, "the kernel refused some bytes (EAGAIN or partial)");
    assert.ok(s.writableLength > 0, "the rest waits in Node's queue");
    p.ins[0].resume();
    await waitUntil(async () => Buffer.concat(p.got[0]).length === sent.length, 10000, "everything arrived");
    assert.equal(text(p.got[0]), sent);
    s.destroy();
    p.server.close();
  });
});

describe("sim --io-uring on vs off (spawned, official openai client)", { skip }, () => {
  let on: SimProcess;
  let off: SimProcess;
  before(async () => {
    [on, off] = await Promise.all([
      startSim({ args: ["--speed", "50", "--io-uring", "on"] }),
      startSim({ args: ["--speed", "50", "--io-uring", "off"] }),
    ]);
  });
  after(async () => {
    await Promise.all([on?.stop(), off?.stop()]);
  });

  it("streams the same answers, concurrently, chunk for chunk", async () => {
    const read = async (sim: SimProcess, i: number): Promise<string> => {
      const client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
      const stream = await client.chat.completions.create({
        model: "sim-model",
        messages: [{ role: "user", content: `same question ${i}` }],
        max_tokens: 40,
        seed: i,
        n: 2,
        stream: true,
        stream_options: { include_usage: true },
      });
      const texts = ["", ""];
      const finish: (string | null)[] = [null, null];
      let usage = -1;
      for await (const c of stream) {
        for (const ch of c.choices) {
          texts[ch.index] += ch.delta.content ?? "";
          if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
        }
        if (c.usage) usage = c.usage.completion_tokens;
      }
      return JSON.stringify({ texts, finish, usage });
    };
    const ids = Array.from({ length: 12 }, (_, i) => i);
    const [a, b] = await Promise.all([
      Promise.all(ids.map((i) => read(on, i))),
      Promise.all(ids.map((i) => read(off, i))),
    ]);
    for (const i of ids) {
      const r = JSON.parse(a[i]) as { texts: string[]; finish: string[]; usage: number };
      assert.equal(r.usage, 80, `stream ${i} complete`);
      assert.deepEqual(r.finish, ["length", "length"]);
      assert.ok(r.texts[0].length > 0 && r.texts[1].length > 0);
    }
    // Chunk boundaries may differ (timing); the text of every choice may not.
    assert.deepEqual(a, b);
  });
});
