import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Unpackr } from "msgpackr";
import { Dealer, Subscriber } from "zeromq";
import { type SimProcess, startSim } from "../../helpers/sim.ts";

// Decodes the wire independently of the publisher's own types: raw frames, msgpackr, both layouts.
const unpackr = new Unpackr({ int64AsType: "bigint", useRecords: false, mapsAsObjects: true });

interface Stored {
  hashes: bigint[];
  parent: bigint | null;
  tokens: number[];
  blockSize: number;
  medium: string;
  extraKeys: unknown;
}
interface Batch {
  seq: bigint;
  ts: number;
  dpRank: unknown;
  payload: Buffer;
  events: { tag: string; raw: unknown }[];
}

function toBig(v: unknown): bigint {
  // Hashes must be msgpack integers (never floats).
  assert.ok(typeof v === "bigint" || Number.isInteger(v), `hash ${String(v)} is an integer`);
  return typeof v === "bigint" ? v : BigInt(v as number);
}

function tagOf(ev: unknown): string {
  return Array.isArray(ev) ? String(ev[0]) : String((ev as Record<string, unknown>).type);
}

function stored(ev: unknown): Stored {
  if (Array.isArray(ev)) {
    return {
      hashes: (ev[1] as unknown[]).map(toBig),
      parent: ev[2] === null ? null : toBig(ev[2]),
      tokens: ev[3] as number[],
      blockSize: ev[4] as number,
      medium: ev[6] as string,
      extraKeys: ev[8],
    };
  }
  const m = ev as Record<string, unknown>;
  return {
    hashes: (m.block_hashes as unknown[]).map(toBig),
    parent: m.parent_block_hash === null ? null : toBig(m.parent_block_hash),
    tokens: m.token_ids as number[],
    blockSize: m.block_size as number,
    medium: m.medium as string,
    extraKeys: m.extra_keys,
  };
}

function removedHashes(ev: unknown): bigint[] {
  const list = Array.isArray(ev) ? ev[1] : (ev as Record<string, unknown>).block_hashes;
  return (list as unknown[]).map(toBig);
}

class Collector {
  readonly batches: Batch[] = [];
  private readonly sub = new Subscriber();
  /**
   * The SUB's ZMTP handshake with the sim's PUB succeeded (ZMQ_EVENT_HANDSHAKE_SUCCEEDED): the
   * SUB sends its subscription right after it, so it is at the PUB well before the sim has
   * handled a request and published. Waited for instead of a fixed 300 ms "slow joiner" sleep
   * (too short on a loaded box, the first batch lost). This tests the sim's own PUB, so the
   * subscription's arrival itself (FakePublisher's XPUB) cannot be observed here.
   */
  readonly joined: Promise<void>;
  constructor(endpoint: string, topic: string) {
    this.joined = new Promise((resolve) => this.sub.events.on("handshake", () => resolve()));
    this.sub.connect(endpoint);
    this.sub.subscribe(topic);
    void this.loop();
  }
  private async loop(): Promise<void> {
    try {
      for await (const frames of this.sub) {
        assert.equal(frames.length, 3, "3 frames: topic, seq, payload");
        assert.equal(frames[1].length, 8);
        const decoded = unpackr.unpack(frames[2]) as unknown;
        // vLLM's newest EventBatch is a map {ts, events, data_parallel_rank} (not array_like:
        // vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34);
        // the older layout an array.
        const payload = Array.isArray(decoded)
          ? decoded
          : (() => {
              const m = decoded as Record<string, unknown>;
              return [m.ts, m.events, m.data_parallel_rank];
            })();
        this.batches.push({
          seq: frames[1].readBigUInt64BE(0),
          ts: payload[0] as number,
          dpRank: payload[2],
          payload: frames[2],
          events: (payload[1] as unknown[]).map((raw) => ({ tag: tagOf(raw), raw })),
        });
      }
    } catch {
      // closed
    }
  }
  events(tag: string): unknown[] {
    return this.batches.flatMap((b) => b.events.filter((e) => e.tag === tag).map((e) => e.raw));
  }
  async waitFor(pred: () => boolean, ms = 5000): Promise<void> {
    const end = Date.now() + ms;
    while (!pred()) {
      if (Date.now() > end) throw new Error("timed out waiting for KV events");
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  close(): void {
    this.sub.close();
  }
}

async function complete(
  sim: SimProcess,
  prompt: number[],
  extra: Record<string, unknown> = {},
): Promise<void> {
  const r = await fetch(`${sim.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: sim.model, prompt, max_tokens: 1, ...extra }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  await r.json();
}

const range = (start: number, n: number): number[] => Array.from({ length: n }, (_, i) => start + i);

for (const encoding of ["array", "map"] as const) {
  describe(`sim KV events over ZMQ (${encoding} encoding)`, () => {
    let sim: SimProcess;
    let col: Collector;

    before(async () => {
      sim = await startSim({
        args: ["--speed", "100", "--num-gpu-blocks", "24", "--kv-events-encoding", encoding],
      });
      col = new Collector(sim.kvEndpoint, "kv-events");
      await col.joined;
    });
    after(async () => {
      col?.close();
      await sim?.stop();
    });

    it("BlockStored carries the full blocks' token ids, block size, medium and a parent chain", async () => {
      const a = range(1000, 70);
      await complete(sim, a);
      await col.waitFor(() => col.events("BlockStored").length >= 1);
      const first = stored(col.events("BlockStored")[0]);
      assert.equal(first.blockSize, 16);
      assert.equal(first.medium, "GPU");
      assert.equal(first.parent, null);
      assert.equal(first.hashes.length, 4, "70 tokens = 4 full blocks");
      assert.deepEqual(first.tokens, a.slice(0, 64));
      assert.equal(new Set(first.hashes.map(String)).size, 4);

      // Shares two blocks with `a`: only the new blocks are stored, chained to a's second block.
      const b = [...a.slice(0, 32), ...range(5000, 40)];
      await complete(sim, b);
      await col.waitFor(() => col.events("BlockStored").length >= 2);
      const second = stored(col.events("BlockStored")[1]);
      assert.equal(second.parent, first.hashes[1]);
      assert.deepEqual(second.tokens, b.slice(32, 64));
      assert.equal(second.hashes.length, 2);
      assert.ok(col.batches.every((x) => x.dpRank === 0));
      assert.ok(col.batches.every((x) => typeof x.ts === "number" && x.ts > 1e9));
    });

    it("cache_salt changes the first block's hash and appears in extra_keys", async () => {
      const p = range(9000, 20);
      const before = col.events("BlockStored").length;
      await complete(sim, p);
      await complete(sim, p, { cache_salt: "tenant-a" });
      await col.waitFor(() => col.events("BlockStored").length >= before + 2);
      const [plain, salted] = col.events("BlockStored").slice(before).map(stored);
      assert.deepEqual(plain.tokens, salted.tokens);
      assert.notEqual(plain.hashes[0], salted.hashes[0]);
      // vLLM's newest layout has one extra_keys entry per block, null without salt/LoRA/mm
      // (vllm/v1/core/block_pool.py: `extra_keys=extra_keys_list if extra_keys_list else None`).
      if (encoding === "map") assert.deepEqual(plain.extraKeys, [null]);
      else assert.ok(plain.extraKeys === null || plain.extraKeys === undefined);
      assert.deepEqual(salted.extraKeys, [["tenant-a"]]);
    });

    it("BlockRemoved names previously stored hashes once the pool is under pressure", async () => {
      // 24 blocks in all: eight 3-block prompts force evictions of the earlier cached blocks.
      for (let i = 0; i < 8; i++) await complete(sim, range(20000 + i * 100, 49));
      await col.waitFor(() => col.events("BlockRemoved").length >= 1);
      const storedHashes = new Set(col.events("BlockStored").flatMap((e) => stored(e).hashes.map(String)));
      const removed = col.events("BlockRemoved").flatMap(removedHashes);
      assert.ok(removed.length > 0);
      for (const h of removed) assert.ok(storedHashes.has(String(h)), `removed ${h} was stored before`);
      // Sequence numbers are consecutive from 0.
      col.batches.forEach((b, i) => {
        assert.equal(b.seq, BigInt(i));
      });
    });

    it("replay returns the buffered batches from the requested seq, then END (-1)", async () => {
      const dealer = new Dealer();
      dealer.connect(sim.replayEndpoint);
      try {
        const ask = async (start: number): Promise<{ seqs: bigint[]; payloads: Buffer[] }> => {
          const buf = Buffer.alloc(8);
          buf.writeBigUInt64BE(BigInt(start));
          await dealer.send(["", buf]);
          const seqs: bigint[] = [];
          const payloads: Buffer[] = [];
          for (;;) {
            const frames = await dealer.receive();
            assert.equal(frames.length, 3);
            assert.equal(frames[0].length, 0);
            const seq = frames[1].readBigInt64BE(0);
            if (seq === -1n) {
              assert.equal(frames[2].length, 0);
              return { seqs, payloads };
            }
            seqs.push(seq);
            payloads.push(frames[2]);
          }
        };
        const total = col.batches.length;
        const all = await ask(0);
        assert.ok(all.seqs.length >= total);
        for (const [i, s] of all.seqs.entries()) assert.equal(s, BigInt(i));
        // Replayed payloads are byte-identical to what was published live.
        for (const [i, b] of col.batches.entries())
          assert.ok(b.payload.equals(all.payloads[i]), `batch ${i}`);
        const tail = await ask(total - 2);
        assert.deepEqual(tail.seqs.slice(0, 2), [BigInt(total - 2), BigInt(total - 1)]);
        const none = await ask(1_000_000);
        assert.equal(none.seqs.length, 0);
      } finally {
        dealer.close();
      }
    });

    it("POST /reset_prefix_cache clears the cache with AllBlocksCleared; hits start over", async () => {
      const r = await fetch(`${sim.url}/reset_prefix_cache`, { method: "POST" });
      assert.equal(r.status, 200);
      await col.waitFor(() => col.events("AllBlocksCleared").length === 1);
      const last = col.batches[col.batches.length - 1];
      assert.deepEqual(
        last.events.map((e) => e.tag),
        ["AllBlocksCleared"],
      );
      const before = col.events("BlockStored").length;
      const a = range(1000, 70);
      await complete(sim, a);
      await col.waitFor(() => col.events("BlockStored").length > before);
      const again = stored(col.events("BlockStored")[before]);
      assert.deepEqual(again.tokens, a.slice(0, 64), "previously cached prefix is stored afresh");
    });
  });
}

describe("sim KV replay buffer keeps only the last buffer_steps batches", () => {
  let sim: SimProcess;
  before(async () => {
    sim = await startSim({ args: ["--speed", "100"], kvEvents: { buffer_steps: 3 } });
  });
  after(async () => {
    await sim?.stop();
  });

  it("replay from 0 returns the newest 3 batches in order, then END", async () => {
    for (let i = 0; i < 5; i++) await complete(sim, range(40000 + i * 100, 20));
    const dealer = new Dealer();
    dealer.connect(sim.replayEndpoint);
    try {
      await dealer.send(["", Buffer.alloc(8)]);
      const seqs: bigint[] = [];
      for (;;) {
        const frames = await dealer.receive();
        const seq = frames[1].readBigInt64BE(0);
        if (seq === -1n) break;
        seqs.push(seq);
      }
      assert.deepEqual(seqs, [2n, 3n, 4n]);
    } finally {
      dealer.close();
    }
  });

  // vllm-project/vllm vllm/distributed/kv_events.py at 0181ea3173e5, ZmqEventPublisher
  // ._service_replay (SGLang's kv_events.py at 006d053f182f is the same): `len(frame) != 3` is
  // logged and answered with nothing; `start_seq = int.from_bytes(start_seq_bytes, "big")`
  // reads a start of any length, unsigned.
  it("answers a malformed request with nothing, and reads start_seq as Python's int.from_bytes", async () => {
    const dealer = new Dealer({ receiveTimeout: 700 });
    dealer.connect(sim.replayEndpoint);
    try {
      await dealer.send(["", Buffer.alloc(8), "extra"]); // 4 frames at the ROUTER
      await assert.rejects(dealer.receive(), "no reply, not even the end marker");
      await dealer.send(["", Buffer.from([3])]); // a 1-byte start: seq 3
      const seqs: bigint[] = [];
      for (;;) {
        const frames = await dealer.receive();
        const seq = frames[1].readBigInt64BE(0);
        if (seq === -1n) break;
        seqs.push(seq);
      }
      assert.deepEqual(seqs, [3n, 4n]);
    } finally {
      dealer.close();
    }
  });
});
