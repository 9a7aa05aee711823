/**
 * FrameDecoder's contract with the daemon's direct read path: push() keeps nothing that
 * points into the chunk it was given (the daemon reads every non-sink byte into one reused
 * staging buffer), and sinkRemainder/advanceSink hand out exactly the unfilled part of a sink
 * destination. Frames of every shape go through one buffer, split at pseudo-random points,
 * scribbled over after every call.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { encodeFrame, type Frame, FrameDecoder, Op } from "../../src/kvd/protocol.ts";
import { bytesFor } from "./helpers.ts";

/** Deterministic split sizes: 1..max, biased towards awkward small ones. */
function splitter(seed: number, max: number): () => number {
  let x = seed;
  return () => {
    x = (x * 1103515245 + 12345) >>> 0;
    return 1 + (x % 8 === 0 ? x % 25 : x % max);
  };
}

interface Sent {
  meta: Record<string, unknown>;
  data: Buffer;
}

function frames(n: number): Sent[] {
  const out: Sent[] = [];
  for (let i = 0; i < n; i++) {
    const size = i % 3 === 0 ? 100_000 + i * 311 : i % 3 === 1 ? i * 7 : 0;
    const key = `k${i}`;
    out.push({ meta: { items: [{ key, size }], pad: "x".repeat(i % 50) }, data: bytesFor(key, size) });
  }
  return out;
}

describe("FrameDecoder and a reused read buffer", () => {
  for (const sinkOn of [false, true]) {
    it(`frames are intact when every read reuses one buffer (${sinkOn ? "with" : "without"} a sink)`, () => {
      const sent = frames(60);
      const wire = Buffer.concat(sent.flatMap((f, i) => encodeFrame(Op.PUT, 0, i, f.meta, f.data)));
      const dests = new Map<number, Buffer>();
      // Large frames get a destination, like the daemon's arena reservation.
      const dec = new FrameDecoder(1 << 20, false, (_op, _meta, len, id) => {
        if (!sinkOn || len < 64 * 1024) return null;
        const buf = Buffer.alloc(len);
        dests.set(id, buf);
        return { buf, token: id };
      });
      const staging = Buffer.alloc(4096);
      const next = splitter(7, staging.length);
      const got: Frame[] = [];
      let off = 0;
      while (off < wire.length) {
        const sink = dec.sinkRemainder();
        const target = sink ?? staging;
        const n = Math.min(next(), target.length, wire.length - off);
        wire.copy(target, 0, off, off + n);
        off += n;
        got.push(...(sink ? dec.advanceSink(n) : dec.push(staging.subarray(0, n))));
        staging.fill(0xee);
      }
      assert.equal(got.length, sent.length);
      got.forEach((f, i) => {
        assert.equal(f.id, i);
        assert.deepEqual(f.meta, sent[i]!.meta);
        assert.ok(f.data.equals(sent[i]!.data), `frame ${i} data`);
        if (sinkOn && sent[i]!.data.length >= 64 * 1024) {
          assert.equal(f.sinkToken, i);
          assert.equal(f.data.buffer, dests.get(i)!.buffer, "the data is the sink destination");
        } else assert.equal(f.sinkToken, undefined);
      });
    });
  }

  it("advanceSink refuses bytes that are not sink data", () => {
    const dec = new FrameDecoder(1 << 20, false, () => null);
    assert.equal(dec.sinkRemainder(), null);
    assert.throws(() => dec.advanceSink(1));
    dec.push(Buffer.concat(encodeFrame(Op.PUT, 0, 1, { items: [] }, Buffer.alloc(100_000))).subarray(0, 200));
    assert.equal(dec.sinkRemainder(), null, "no sink was given");
    assert.throws(() => dec.advanceSink(1));
  });
});
