/**
 * KvIndex behaviour the engines' event semantics require: per-DP-rank pools, LoRA hashing,
 * hybrid KV groups, SGLang partial pages, and the per-rank cap.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { BlockStored } from "../../src/kv/events.ts";
import { DEFAULT_MAX_BLOCKS, KvIndex } from "../../src/kv/index.ts";
import { blockRemoved, blockStored } from "../helpers/kv-events.ts";

const toks = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

const stored = (hashes: number[], tokenIds: number[], more: Partial<BlockStored> = {}) =>
  blockStored(hashes, tokenIds, 16, more);
const removed = (hashes: number[], groupIdx: number | null = null) => blockRemoved(hashes, { groupIdx });

test("DP ranks: a rank's BlockRemoved leaves the same block on another rank; best rank reported", () => {
  // vLLM and SGLang run one publisher (and one block pool) per DP rank, with the same block
  // hashes for the same tokens: vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34
  // (ZmqEventPublisher offset_endpoint_port(endpoint, data_parallel_rank)).
  const index = new KvIndex();
  index.applyEvents("w", [stored([1, 2, 3], toks(48))], 16, 0);
  index.applyEvents("w", [stored([1, 2], toks(32))], 16, 1);
  const ranks = new Int32Array(1);
  assert.deepEqual([...index.overlaps(toks(48), ["w"], null, null, ranks)], [3]);
  assert.equal(ranks[0], 0);
  index.applyEvents("w", [removed([1])], 16, 0); // rank 0 evicts its first block
  assert.deepEqual([...index.overlaps(toks(48), ["w"], null, null, ranks)], [2]);
  assert.equal(ranks[0], 1);
  assert.equal(index.blockCount("w"), 4);
  assert.equal(index.blockCount("w", 1), 2);
  index.clearWorker("w", 1);
  assert.deepEqual([...index.overlaps(toks(48), ["w"])], [0]);
  assert.deepEqual(index.ranksOf("w"), [0]);
});

test("LoRA: blocks stored under a lora_name match only requests hashed with that adapter", () => {
  // vLLM puts the LoRA name first in every block's extra keys, the salt after it in the first
  // block's: vllm-project/vllm vllm/v1/core/kv_cache_utils.py @ 001cabc1be16a59a70d720ed61a13b678c060a18
  // (generate_block_hash_extra_keys: lora_extra_keys + mm_extra_keys + cache_salt_keys + …), and
  // BlockStored carries lora_name (vllm/v1/core/block_pool.py @ c59cb7941357443da7c5eef75cfa8697d683d228).
  const index = new KvIndex();
  index.applyEvents("w", [
    stored([1, 2], toks(32), { loraName: "sql", loraId: 1, extraKeys: [["sql"], ["sql"]] }),
    stored([9], toks(16, 500)),
  ]);
  assert.ok(index.isLora("sql"));
  assert.ok(!index.isLora("base"));
  assert.deepEqual([...index.overlaps(toks(32), ["w"], null, "sql")], [2]);
  assert.deepEqual([...index.overlaps(toks(32), ["w"])], [0]); // the base model has no such blocks
  assert.deepEqual([...index.overlaps(toks(16, 500), ["w"], null, "sql")], [0]);
  // LoRA name then salt: the salt is the string after the leading LoRA name (before the fix the
  // LoRA name alone was taken as a salt, and the salted block matched no one).
  index.applyEvents("w", [stored([3], toks(16, 900), { loraName: "sql", extraKeys: [["sql", "tenant"]] })]);
  assert.deepEqual([...index.overlaps(toks(16, 900), ["w"], "tenant", "sql")], [1]);
  assert.deepEqual([...index.overlaps(toks(16, 900), ["w"], null, "sql")], [0]);
});

test("hybrid models: only the full-attention group is indexed; removals of other groups are ignored", () => {
  // vLLM BlockStored carries group_idx and kv_cache_spec_kind (vllm/distributed/kv_events.py @
  // 0181ea3173e53eea8cf04a86891488e3dc89bb34); KVCacheSpecKind values full_attention,
  // mla_attention, sliding_window, mamba, … (vllm/v1/kv_cache_interface.py). The same block hash
  // appears in every group (make_block_hash_with_group_id), so a sliding-window eviction must not
  // erase the full-attention block.
  const index = new KvIndex();
  index.applyEvents("w", [
    stored([1, 2], toks(32), { groupIdx: 0, kvCacheSpecKind: "sliding_window" }),
    stored([1, 2], toks(32), { groupIdx: 1, kvCacheSpecKind: "full_attention" }),
  ]);
  assert.deepEqual([...index.overlaps(toks(32), ["w"])], [2]);
  index.applyEvents("w", [removed([1], 0)]); // sliding window drops block 1 of group 0
  assert.deepEqual([...index.overlaps(toks(32), ["w"])], [2]);
  index.applyEvents("w", [removed([2], 1)]);
  assert.deepEqual([...index.overlaps(toks(32), ["w"])], [1]);
  // Mamba-only stores never count.
  const m = new KvIndex();
  m.applyEvents("w", [stored([1], toks(16), { groupIdx: 0, kvCacheSpecKind: "mamba" })]);
  assert.deepEqual([...m.overlaps(toks(16), ["w"])], [0]);
});

test("SGLang partial last page keeps the worker's block size and is not indexed", () => {
  // SGLang emits one BlockStored per page with block_size=len(page_tokens), so a node's last
  // page may be short: sgl-project/sglang python/sglang/srt/mem_cache/radix_cache.py
  // @ 95769b280eaaf946a45dd3b50f7e864df09ac893 (_record_store_event).
  const index = new KvIndex();
  index.addWorker("w", 16);
  index.applyEvents("w", [
    stored([1], toks(16)),
    { ...stored([2], toks(5, 17)), parentBlockHash: 1, blockSize: 5 },
  ]);
  assert.equal(index.blockSizeOf("w"), 16);
  assert.deepEqual([...index.overlaps(toks(32), ["w"])], [1]);
  assert.equal(index.counters.partialPages, 1);
});

test("the index caps each rank at kvBlocks × (1 + margin) and counts the drops", () => {
  const drops: number[] = [];
  const index = new KvIndex({ capMargin: 0.25 });
  index.onCapped = (_w, n) => drops.push(n);
  index.addWorker("w", 1, 0, 8); // pool of 8 blocks → cap 10
  index.applyEvents("w", [stored(toks(30), toks(30), { blockSize: 1 })], 1);
  assert.equal(index.blockCount("w"), 10);
  assert.deepEqual(drops, [20]);
  assert.equal(index.counters.capped, 20);
  // Unknown pool size: the configurable default.
  assert.equal(new KvIndex().capFor(undefined), DEFAULT_MAX_BLOCKS);
  assert.equal(new KvIndex({ defaultMaxBlocks: 1000 }).capFor(undefined), 1000);
});
