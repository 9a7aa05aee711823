import assert from "node:assert/strict";
import { test } from "node:test";
import { Packr } from "msgpackr";
import {
  type BlockStored,
  decodeMessage,
  encodeSeq,
  isDecodeError,
  normaliseHash,
} from "../../src/kv/events.ts";

const packr = new Packr({ useRecords: false });
const pack = (v: unknown) => packr.pack(v);
const big = 0xfedcba9876543210n; // > 2^63: sent as msgpack uint64

const tokens = Array.from({ length: 32 }, (_, i) => 1000 + i);

function arrayBatch(): unknown {
  return [
    1733.5,
    [
      ["BlockStored", [big, 7], null, tokens, 16, null, "GPU", null, [["salt-a"], null], 0],
      ["BlockRemoved", [7], "GPU", 0],
      ["AllBlocksCleared"],
    ],
    2,
  ];
}

function mapBatch(): unknown {
  return [
    1733.5,
    [
      {
        type: "BlockStored",
        block_hashes: [big, 7],
        parent_block_hash: null,
        token_ids: tokens,
        block_size: 16,
        lora_id: null,
        medium: "GPU",
        lora_name: null,
        extra_keys: [["salt-a"], null],
        group_idx: 0,
      },
      { type: "BlockRemoved", block_hashes: [7], medium: "GPU", group_idx: 0 },
      { type: "AllBlocksCleared" },
    ],
    2,
  ];
}

function checkDecoded(frames: Uint8Array[], framing: "seq" | "atom", topic: string, seq: number | null) {
  const msg = decodeMessage(frames, framing);
  assert.ok(!isDecodeError(msg), JSON.stringify(msg));
  assert.equal(msg.topic, topic);
  assert.equal(msg.seq, seq);
  assert.equal(msg.batch.ts, 1733.5);
  assert.equal(msg.batch.dpRank, 2);
  assert.equal(msg.batch.skipped, 0);
  const [stored, removed, cleared] = msg.batch.events;
  assert.equal(stored.type, "BlockStored");
  const s = stored as BlockStored;
  assert.deepEqual(s.blockHashes, [Number(big), 7]);
  assert.equal(s.parentBlockHash, null);
  assert.deepEqual(s.tokenIds, tokens);
  assert.equal(s.blockSize, 16);
  assert.equal(s.loraId, null);
  assert.equal(s.medium, "GPU");
  assert.equal(s.loraName, null);
  assert.deepEqual(s.extraKeys, [["salt-a"], null]);
  assert.equal(s.groupIdx, 0);
  assert.deepEqual(removed, { type: "BlockRemoved", blockHashes: [7], medium: "GPU", groupIdx: 0 });
  assert.deepEqual(cleared, { type: "AllBlocksCleared" });
}

test("vLLM 3-frame message, positional-array events", () => {
  checkDecoded([Buffer.from("kv-events"), encodeSeq(41), pack(arrayBatch())], "seq", "kv-events", 41);
});

test("vLLM 3-frame message, map events (newer vLLM)", () => {
  checkDecoded([Buffer.from("kv-events"), encodeSeq(0), pack(mapBatch())], "seq", "kv-events", 0);
});

test("ATOM framing: [payload] and [topic, payload], both encodings", () => {
  checkDecoded([pack(arrayBatch())], "atom", "", null);
  checkDecoded([Buffer.from("t"), pack(mapBatch())], "atom", "t", null);
});

test("ATOM BlockTransferred and bytes / parent hashes", () => {
  const h = Buffer.from("0123456789abcdef0123456789abcdef");
  const batch = [
    1,
    [
      ["BlockTransferred", [5, 6], "GPU", "CPU", 0],
      ["BlockStored", [h], 5, tokens.slice(0, 16), 16, 3, null, "lora-x", null, null],
    ],
  ];
  const msg = decodeMessage([pack(batch)], "atom");
  assert.ok(!isDecodeError(msg));
  assert.equal(msg.batch.dpRank, null);
  assert.deepEqual(msg.batch.events[0], {
    type: "BlockTransferred",
    blockHashes: [5, 6],
    fromMedium: "GPU",
    toMedium: "CPU",
    groupIdx: 0,
  });
  const s = msg.batch.events[1] as BlockStored;
  assert.equal(s.blockHashes[0], normaliseHash(h));
  assert.notEqual(normaliseHash(h), normaliseHash(Buffer.from("0123456789abcdef0123456789abcdeX")));
  assert.equal(s.parentBlockHash, 5);
  assert.equal(s.loraId, 3);
  assert.equal(s.loraName, "lora-x");
  assert.equal(s.medium, null);
});

test("a signed seq of -1 and large seqs read back", () => {
  const msg = decodeMessage([Buffer.from(""), encodeSeq(2 ** 40), pack([0, []])], "seq");
  assert.ok(!isDecodeError(msg));
  assert.equal(msg.seq, 2 ** 40);
});

test("malformed input yields errors or skipped events, never throws", () => {
  const bad: Uint8Array[][] = [
    [Buffer.from("t"), Buffer.from([1, 2, 3]), pack([0, []])],
    [Buffer.from("t"), encodeSeq(1), Buffer.from([0xc1, 0xff, 0x00])],
    [Buffer.from("t"), encodeSeq(1), pack("hello")],
    [Buffer.from("t"), encodeSeq(1), pack([0, "not a list"])],
    [Buffer.from("a"), Buffer.from("b"), Buffer.from("c"), Buffer.from("d")],
    [pack([0, []])], // one frame is not vLLM framing
  ];
  for (const frames of bad) assert.ok(isDecodeError(decodeMessage(frames, "seq")));
  const partly = decodeMessage(
    [
      Buffer.from("t"),
      encodeSeq(3),
      pack([0, [["Nope", 1], ["BlockStored", "x"], { type: "BlockRemoved" }, 5, ["AllBlocksCleared"]]]),
    ],
    "seq",
  );
  assert.ok(!isDecodeError(partly));
  assert.equal(partly.batch.skipped, 4);
  assert.deepEqual(partly.batch.events, [{ type: "AllBlocksCleared" }]);
});
