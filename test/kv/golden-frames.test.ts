/**
 * Golden KV-event frames, encoded byte by byte as each engine's msgspec structs put them on the
 * wire, fed to the decoder. The encoder below writes msgpack the way msgspec does (smallest int
 * form, float64 for floats, str/bin with the shortest header, maps in field order).
 *
 * Sources (the field orders and defaults are from these):
 * - vLLM: vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34
 *   (EventBatch omit_defaults map form with `data_parallel_rank`; KVCacheEvent tag=True →
 *   `type` key; BlockStored fields block_hashes, parent_block_hash, token_ids, block_size,
 *   lora_id, medium, lora_name, extra_keys=None, group_idx=None, kv_cache_spec_kind=None,
 *   kv_cache_spec_sliding_window=None; frames (topic, seq 8-byte BE, payload)). The older
 *   array_like form is the same fields positionally ([tag, ...fields]).
 * - SGLang: sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py (the revision with
 *   BlockStoredWithMetadata and `_live_topic`; older 612d579090db24ec7c47cc5ca6b83e0c649b8c28 has
 *   neither): EventBatch array_like [ts, events, attn_dp_rank]; BlockStored array_like
 *   [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium];
 *   BlockStoredWithMetadata appends `metadata` = BlockStoredMetadata{cache_salt} (a map, not
 *   array_like) at position 7; snapshot mode sends topic + b"\x00sgl-kv-epoch=" + epoch.
 * - ATOM: ROCm/ATOM atom/distributed/kv_events.py @ 0290bb3f917fc3f4907fbaa763762b3fc5142f73
 *   (array_like, omit_defaults=True: trailing default fields are left off — medium "GPU",
 *   group_idx 0, data_parallel_rank None; AllBlocksCleared has a `medium`; BlockTransferred;
 *   frames [payload] with an empty topic, else [topic, payload]).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  type AllBlocksCleared,
  type BlockStored,
  decodeMessage,
  isDecodeError,
  type KvMessage,
} from "../../src/kv/events.ts";
import { KvIndex } from "../../src/kv/index.ts";

type V = null | boolean | number | bigint | string | Uint8Array | V[] | Map<string, V>;

/** msgpack as msgspec writes it. */
function mp(v: V): Buffer {
  const out: number[] = [];
  const u = (prefix: number, n: number, bytes: number) => {
    out.push(prefix);
    for (let i = bytes - 1; i >= 0; i--) out.push(Number((BigInt(n) >> BigInt(8 * i)) & 0xffn));
  };
  const w = (x: V): void => {
    if (x === null) out.push(0xc0);
    else if (typeof x === "boolean") out.push(x ? 0xc3 : 0xc2);
    else if (typeof x === "bigint") {
      out.push(0xcf);
      for (let i = 7; i >= 0; i--) out.push(Number((x >> BigInt(8 * i)) & 0xffn));
    } else if (typeof x === "number" && !Number.isInteger(x)) {
      const b = Buffer.alloc(8);
      b.writeDoubleBE(x);
      out.push(0xcb, ...b);
    } else if (typeof x === "number") {
      if (x >= 0 && x < 128) out.push(x);
      else if (x < 0 && x >= -32) out.push(x & 0xff);
      else if (x >= 0 && x < 256) out.push(0xcc, x);
      else if (x >= 0 && x < 65536) out.push(0xcd, ...[x >> 8, x & 0xff]);
      else if (x >= 0 && x < 2 ** 32) u(0xce, x, 4);
      else if (x >= 0) w(BigInt(x));
      else {
        out.push(0xd3);
        const b = Buffer.alloc(8);
        b.writeBigInt64BE(BigInt(x));
        out.push(...b);
      }
    } else if (typeof x === "string") {
      const b = Buffer.from(x, "utf8");
      if (b.length < 32) out.push(0xa0 | b.length);
      else if (b.length < 256) out.push(0xd9, b.length);
      else u(0xda, b.length, 2);
      out.push(...b);
    } else if (x instanceof Uint8Array) {
      out.push(0xc4, x.length, ...x);
    } else if (Array.isArray(x)) {
      if (x.length < 16) out.push(0x90 | x.length);
      else u(0xdc, x.length, 2);
      for (const e of x) w(e);
    } else {
      if (x.size < 16) out.push(0x80 | x.size);
      else u(0xde, x.size, 2);
      for (const [k, e] of x) {
        w(k);
        w(e);
      }
    }
  };
  w(v);
  return Buffer.from(out);
}

const m = (entries: [string, V][]) => new Map<string, V>(entries);
const seqFrame = (n: number) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n)); // seq.to_bytes(8, "big")
  return b;
};
const toks = (n: number, from = 100) => Array.from({ length: n }, (_, i) => from + i);
const BIG = 0xf234567890abcdefn; // ExternalBlockHash above 2^63: uint64 on the wire

function ok(frames: Uint8Array[], framing: "seq" | "atom"): KvMessage {
  const msg = decodeMessage(frames, framing);
  assert.ok(!isDecodeError(msg), JSON.stringify(msg));
  assert.equal(msg.batch.skipped, 0);
  return msg;
}

test("vLLM map form (omit_defaults): map batch with data_parallel_rank, all BlockStored fields", () => {
  const stored = m([
    ["type", "BlockStored"],
    ["block_hashes", [BIG, 7]],
    ["parent_block_hash", null],
    ["token_ids", toks(32)],
    ["block_size", 16],
    ["lora_id", 3],
    ["medium", "GPU"],
    ["lora_name", "sql-adapter"],
    ["extra_keys", [["sql-adapter", "salt-1"], ["sql-adapter"]]],
    ["group_idx", 1],
    ["kv_cache_spec_kind", "full_attention"],
    ["kv_cache_spec_sliding_window", 4096],
  ]);
  const removed = m([
    ["type", "BlockRemoved"],
    ["block_hashes", [7]],
    ["medium", "GPU"],
    ["group_idx", 1],
  ]);
  const batch = m([
    ["ts", 1733000000.25],
    ["events", [stored, removed, m([["type", "AllBlocksCleared"]])]],
    ["data_parallel_rank", 3],
  ]);
  const msg = ok([Buffer.from("kv"), seqFrame(41), mp(batch)], "seq");
  assert.equal(msg.topic, "kv");
  assert.equal(msg.epoch, null);
  assert.equal(msg.seq, 41);
  assert.equal(msg.batch.ts, 1733000000.25);
  assert.equal(msg.batch.dpRank, 3);
  const s = msg.batch.events[0] as BlockStored;
  assert.equal(s.blockHashes[0], Number(BIG));
  assert.equal(s.blockSize, 16);
  assert.equal(s.loraId, 3);
  assert.equal(s.loraName, "sql-adapter");
  assert.equal(s.cacheSalt ?? null, null);
  assert.equal(s.groupIdx, 1);
  assert.equal(s.kvCacheSpecKind, "full_attention");
  assert.equal(s.kvCacheSpecSlidingWindow, 4096);
  assert.deepEqual(msg.batch.events[1], {
    type: "BlockRemoved",
    blockHashes: [7],
    medium: "GPU",
    groupIdx: 1,
  });
  assert.deepEqual(msg.batch.events[2], { type: "AllBlocksCleared" });
});

test("vLLM map form with every optional field left off (omit_defaults) and no dp rank", () => {
  const stored = m([
    ["type", "BlockStored"],
    ["block_hashes", [5]],
    ["parent_block_hash", 4],
    ["token_ids", toks(16)],
    ["block_size", 16],
    ["lora_id", null],
    ["medium", null],
    ["lora_name", null],
  ]);
  const msg = ok(
    [
      Buffer.from(""),
      seqFrame(0),
      mp(
        m([
          ["ts", 1.5],
          ["events", [stored]],
        ]),
      ),
    ],
    "seq",
  );
  assert.equal(msg.batch.dpRank, null);
  const s = msg.batch.events[0] as BlockStored;
  assert.equal(s.parentBlockHash, 4);
  assert.equal(s.groupIdx, null);
  assert.equal(s.extraKeys, null);
  assert.equal(s.kvCacheSpecKind, null);
});

// vllm-project/vllm vllm/distributed/kv_events.py @ b4e69e0af33f4698e157a262cc787fe61983cd3d:
// `class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False)` while
// `KVCacheEvent` stays `tag=True, omit_defaults=True` without array_like: the batch is an array
// [ts, events(, data_parallel_rank)] whose events are tagged maps — neither older form.
test("vLLM b4e69e0 form: array batch (omit_defaults) of tagged map events", () => {
  const stored = m([
    ["type", "BlockStored"],
    ["block_hashes", [BIG, 9]],
    ["parent_block_hash", null],
    ["token_ids", toks(32)],
    ["block_size", 16],
    ["lora_id", null],
    ["medium", "GPU"],
    ["lora_name", null],
    ["group_idx", 0],
    ["kv_cache_spec_kind", "full_attention"],
  ]);
  const removed = m([
    ["type", "BlockRemoved"],
    ["block_hashes", [9]],
    ["medium", "GPU"],
  ]);
  for (const [batch, dp] of [
    [[1733000001.5, [stored, removed]], null],
    [[1733000001.5, [stored, removed], 2], 2],
  ] as [V, number | null][]) {
    const msg = ok([Buffer.from("kv"), seqFrame(7), mp(batch)], "seq");
    assert.equal(msg.seq, 7);
    assert.equal(msg.batch.ts, 1733000001.5);
    assert.equal(msg.batch.dpRank, dp);
    const s = msg.batch.events[0] as BlockStored;
    assert.deepEqual(s.blockHashes, [Number(BIG), 9]);
    assert.equal(s.blockSize, 16);
    assert.equal(s.groupIdx, 0);
    assert.equal(s.kvCacheSpecKind, "full_attention");
    assert.equal(s.tokenIds.length, 32);
    assert.deepEqual(msg.batch.events[1], {
      type: "BlockRemoved",
      blockHashes: [9],
      medium: "GPU",
      groupIdx: null,
    });
  }
});

test("vLLM array form: [tag, ...fields] in field order, batch [ts, events, dp_rank]", () => {
  const stored: V = [
    "BlockStored",
    [BIG],
    null,
    toks(16),
    16,
    null,
    "GPU",
    "lora-a",
    [["lora-a", "s"]],
    0,
    "sliding_window",
    128,
  ];
  const msg = ok(
    [Buffer.from("t"), seqFrame(2), mp([2.5, [stored, ["BlockRemoved", [BIG], "GPU", 0]], 1])],
    "seq",
  );
  assert.equal(msg.batch.dpRank, 1);
  const s = msg.batch.events[0] as BlockStored;
  assert.equal(s.loraName, "lora-a");
  assert.equal(s.kvCacheSpecKind, "sliding_window");
  assert.equal(s.kvCacheSpecSlidingWindow, 128);
  assert.equal(s.cacheSalt ?? null, null);
});

test("SGLang BlockStoredWithMetadata: position 7 is {cache_salt}, not a LoRA name; attn_dp_rank read", () => {
  const salted: V = ["BlockStored", [11], null, toks(16), 16, null, "GPU", m([["cache_salt", "tenant-a"]])];
  const plain: V = ["BlockStored", [12], null, toks(16), 16, null, "GPU"];
  const msg = ok(
    [Buffer.from("kv"), seqFrame(9), mp([7.0 + 0.5, [salted, plain, ["BlockRemoved", [12], "GPU"]], 2])],
    "seq",
  );
  assert.equal(msg.batch.dpRank, 2);
  const s = msg.batch.events[0] as BlockStored;
  assert.equal(s.cacheSalt, "tenant-a");
  assert.equal(s.loraName, null);
  const p = msg.batch.events[1] as BlockStored;
  assert.equal(p.cacheSalt ?? null, null);
  // In the index: the salted block is a hit only for its salt, the plain one only unsalted
  // (before the fix the salted block was indexed as unsalted).
  const index = new KvIndex();
  index.applyEvents("w", [s], 16);
  assert.deepEqual([...index.overlaps(toks(16), ["w"], "tenant-a")], [1]);
  assert.deepEqual([...index.overlaps(toks(16), ["w"])], [0]);
});

test("SGLang snapshot mode: topic + \\0sgl-kv-epoch=…, and a snapshot barrier, match the topic by prefix", () => {
  const payload = mp([1.0, [], 0]);
  const live = ok([Buffer.from("kv\x00sgl-kv-epoch=ab12"), seqFrame(0), payload], "seq");
  assert.equal(live.topic, "kv");
  assert.equal(live.epoch, "ab12");
  const barrier = ok(
    [Buffer.from("kv\x00sgl-kv-epoch=ab12\x00sgl-kv-snapshot=b-1"), seqFrame(1), payload],
    "seq",
  );
  assert.equal(barrier.topic, "kv");
  assert.equal(barrier.epoch, "ab12");
});

test("ATOM: omit_defaults trailing fields, [payload] and [topic, payload], BlockTransferred, AllBlocksCleared(medium)", () => {
  // BlockStored with lora_id=None, medium="GPU", … group_idx=0 all default: only 5 slots.
  const stored: V = ["BlockStored", [21, 22], null, toks(32), 16];
  const cpu: V = ["BlockStored", [23], 22, toks(16, 500), 16, null, "CPU"];
  const moved: V = ["BlockTransferred", [22], "GPU", "CPU"];
  const clearedCpu: V = ["AllBlocksCleared", "CPU"];
  const one = ok([mp([3.25, [stored, cpu, moved, clearedCpu]])], "atom");
  assert.equal(one.topic, "");
  assert.equal(one.seq, null);
  assert.equal(one.batch.dpRank, null);
  const s = one.batch.events[0] as BlockStored;
  assert.equal(s.medium, null); // left off = the default "GPU"
  assert.equal(s.groupIdx, null);
  assert.equal((one.batch.events[1] as BlockStored).medium, "CPU");
  assert.deepEqual(one.batch.events[2], {
    type: "BlockTransferred",
    blockHashes: [22],
    fromMedium: "GPU",
    toMedium: "CPU",
    groupIdx: null,
  });
  assert.equal((one.batch.events[3] as AllBlocksCleared).medium, "CPU");
  const two = ok([Buffer.from("atom-kv"), mp([3.25, [["AllBlocksCleared"]], 1])], "atom");
  assert.equal(two.topic, "atom-kv");
  assert.equal(two.batch.dpRank, 1);

  // In the index: the CPU store and the CPU-only clear leave GPU blocks alone; the transfer
  // out of GPU removes block 22 (the second), so one block of the prompt remains.
  const index = new KvIndex();
  index.applyEvents("w", one.batch.events, 16);
  assert.deepEqual([...index.overlaps(toks(32), ["w"])], [1]);
});

test("golden bytes: a vLLM array-form frame pinned byte for byte", () => {
  // ["BlockRemoved", [1], "GPU", 0] in a batch [0.5, [...], 0]
  const payload = Buffer.from(
    "93" +
      "cb3fe0000000000000" +
      "91" +
      "94" +
      "ac426c6f636b52656d6f766564" +
      "9101" +
      "a3475055" +
      "00" +
      "00",
    "hex",
  );
  assert.deepEqual(payload, mp([0.5, [["BlockRemoved", [1], "GPU", 0]], 0]));
  const msg = ok([Buffer.from(""), seqFrame(5), payload], "seq");
  assert.deepEqual(msg.batch.events, [
    { type: "BlockRemoved", blockHashes: [1], medium: "GPU", groupIdx: 0 },
  ]);
});
