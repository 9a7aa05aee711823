/**
 * Offloaded KV tiers in the index and in kv-prefix (issue #29 item 6). The events are shaped as
 * vLLM's offloading connector sends them (vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py @
 * 0072b0b7443bdddf17824c78d4feae8e1fc12fb4, take_events: BlockStored with the backend's medium,
 * "CPU" for CPULoadStoreSpec, the engine's block hashes, token_ids=[], parent_block_hash=None;
 * BlockRemoved with the same medium), after the GPU's own BlockStored of the same hashes; and,
 * at the end, offloaded blocks larger than a GPU block (sources there).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Packr } from "msgpackr";
import { decodeBatch, decodeBatchGeneric, type KvEvent } from "../../src/kv/events.ts";
import { KvIndex } from "../../src/kv/index.ts";
import { scorers } from "../../src/router/pipeline/registry.ts";
import { RowArena } from "../../src/router/pipeline/rows.ts";
import type { ModelScope, StepContext } from "../../src/router/pipeline/types.ts";
import type { RoutingRequest } from "../../src/router/types.ts";
import { createLogger } from "../../src/util/log.ts";
import { blockRemoved, blockStored } from "../helpers/kv-events.ts";
import { makeWorker } from "../router/pipeline/recorder.ts";

const BS = 4;
const prompt = Array.from({ length: 22 }, (_, i) => 700 + i); // 5 full blocks
const HASHES = [11, 12, 13, 14, 15];

const gpuStored = (): KvEvent => blockStored(HASHES, prompt.slice(0, 20), BS);
const offloaded = (hashes: number[], medium = "CPU"): KvEvent => blockStored(hashes, [], BS, { medium });
const removed = (hashes: number[], medium: string): KvEvent => blockRemoved(hashes, { medium });

test("a prefix offloaded to CPU stays findable after the GPU evicts it; its CPU eviction ends that", () => {
  const idx = new KvIndex();
  idx.addWorker("a", BS);
  idx.addWorker("b", BS);
  idx.applyEvents("a", [gpuStored(), offloaded(HASHES)]);
  assert.deepEqual([...idx.overlaps(prompt, ["a", "b"])], [5, 0]);
  assert.deepEqual([...idx.tierOverlaps(prompt, ["a", "b"])!.host], [5, 0]);
  // The GPU evicts the last three blocks: the GPU overlap drops, the host copy stays.
  idx.applyEvents("a", [removed([13, 14, 15], "GPU")]);
  assert.deepEqual([...idx.overlaps(prompt, ["a", "b"])], [2, 0]);
  const t = idx.tierOverlaps(prompt, ["a", "b"])!;
  assert.deepEqual(
    [[...t.host], [...t.disk]],
    [
      [5, 0],
      [0, 0],
    ],
  );
  // The offload tier evicts block 14: the host prefix ends at block 13.
  idx.applyEvents("a", [removed([14], "CPU")]);
  assert.deepEqual([...idx.tierOverlaps(prompt, ["a"])!.host], [3]);
  assert.equal(idx.tierBlocks().host, 4);
  idx.removeWorker("a");
  assert.equal(idx.tierOverlaps(prompt, ["a", "b"]), null, "nothing offloaded is known any more");
});

test("a disk medium and a GPU → CPU move land in their tiers; unresolvable hashes are ignored", () => {
  const idx = new KvIndex();
  idx.addWorker("a", BS);
  idx.applyEvents("a", [gpuStored(), offloaded([11, 12, 13], "CPU_TIER2")]);
  assert.deepEqual([...idx.tierOverlaps(prompt, ["a"])!.disk], [3]);
  idx.applyEvents("a", [
    { type: "BlockTransferred", blockHashes: [11, 12], fromMedium: "GPU", toMedium: "CPU", groupIdx: null },
  ]);
  assert.deepEqual([...idx.overlaps(prompt, ["a"])], [0], "moved out of the GPU");
  assert.deepEqual([...idx.tierOverlaps(prompt, ["a"])!.host], [2], "and into host memory");
  const before = idx.counters.ignored;
  idx.applyEvents("a", [offloaded([999])]);
  assert.equal(idx.tierBlocks().host, 2);
  assert.ok(idx.counters.ignored > before, "a hash the GPU never reported cannot be placed");
});

test("kv-prefix: an offloaded prefix attracts its follow-up at a lower weight than a GPU hit", () => {
  const logger = createLogger("test");
  logger.level = "silent";
  const idx = new KvIndex();
  for (const id of ["gpu", "cpu", "cold"]) idx.addWorker(id, BS);
  // "gpu" holds the prompt on its GPU; "cpu" held it, was evicted, keeps it offloaded.
  idx.applyEvents("gpu", [gpuStored()]);
  idx.applyEvents("cpu", [gpuStored(), offloaded(HASHES), removed(HASHES, "GPU")]);
  const m = new Map<string, unknown>();
  const sc: ModelScope = {
    model: "m",
    logger,
    kvIndex: idx,
    onClose: () => {},
    reportBridge: () => {},
    shared: <T>(k: string, make: () => T): T => {
      if (!m.has(k)) m.set(k, make());
      return m.get(k) as T;
    },
  };
  const req: RoutingRequest = {
    requestId: "r",
    model: "m",
    endpoint: "completion",
    body: {},
    stream: false,
    promptText: () => "p",
    promptTokens: () => prompt,
  };
  const all = ["gpu", "cpu", "cold"].map((id) => makeWorker({ id, blockSize: BS }));
  const s = scorers.get("kv-prefix")!.build(sc, {});
  const c: StepContext = {
    req,
    step: "mixed",
    scope: sc,
    all,
    rows: new RowArena(),
    overlaps: () => s.overlapSource!.overlaps(c).overlaps,
    ranks: () => new Int32Array(3).fill(-1),
    bridged: () => null,
    blockSize: () => BS,
    promptBlocks: () => 5,
    promptBlocksRow: () => new Int32Array(3).fill(5),
    held: () => 0,
    loads: () => new Float64Array(3),
  };
  const out = new Float64Array(3);
  s.score(c, [0, 1, 2], 1, out);
  // 5 prompt blocks: GPU hit 0 to prefill; host copy 5 − 0.5 × 5; cold 5.
  assert.deepEqual(Array.from(out), [0, 2.5, 5]);
  const off = scorers.get("kv-prefix")!.build(sc, { hostTierWeight: 0, diskTierWeight: 0 });
  off.score(c, [0, 1, 2], 1, out);
  assert.deepEqual(Array.from(out), [0, 5, 5], "weights 0: offloaded copies ignored, as before");
});

// An offloaded block spanning k GPU blocks: vLLM's connector names it by the concatenation of
// its GPU blocks' digests (vllm/v1/core/kv_cache_utils.py BlockHashListWithBlockSize
// ._get_value_at @ 001cabc1be16a59a70d720ed61a13b678c060a18: `merged_hash += block_hashes[i]`),
// from `_get_block_hashes` with target size `offloaded_block_size`, and sends the bytes as they
// are (offloading/scheduler.py take_events @ 0072b0b7443bdddf17824c78d4feae8e1fc12fb4), with
// `block_size` = the offloaded size (OffloadingEvent.block_size). GPU events carry the digests
// as bytes, or under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES their low 64 bits as an int
// (maybe_convert_block_hash @ 001cabc1).
const packr = new Packr({ useRecords: false });
/** Four sha256-sized digests; bytes 24-25 zero so the low 64 bits fit a double exactly. */
const DIGESTS = [1, 2, 3, 4].map((n) =>
  Buffer.from(Array.from({ length: 32 }, (_, i) => (i === 24 || i === 25 ? 0 : (n * 37 + i * 11) & 0xff))),
);
const low64 = (d: Buffer) => Number(d.readBigUInt64BE(24));
const prompt4 = prompt.slice(0, 16);

function decoded(events: unknown[]): KvEvent[] {
  const payload = packr.pack([0, events, null]);
  const fast = decodeBatch(payload);
  const slow = decodeBatchGeneric(payload);
  assert.ok(!("error" in fast) && !("error" in slow));
  assert.deepEqual(fast.events, slow.events, "both decoders build the same events");
  return fast.events;
}
const gpu = (hashes: unknown[]) => ["BlockStored", hashes, null, prompt4, BS, null, "GPU", null, null];
const cpu = (hashes: Buffer[], size: number) => ["BlockStored", hashes, null, [], size, null, "CPU", null];

test("an offloaded block of 2 GPU blocks (concatenated digests) is split and found; its removal drops both", () => {
  const idx = new KvIndex();
  idx.addWorker("a", BS);
  const [a, b, c, d] = DIGESTS;
  idx.applyEvents(
    "a",
    decoded([
      gpu(DIGESTS),
      cpu([Buffer.concat([a, b]), Buffer.concat([c, d])], 2 * BS),
      ["BlockRemoved", DIGESTS, "GPU"],
    ]),
  );
  assert.deepEqual([...idx.overlaps(prompt4, ["a"])], [0], "gone from the GPU");
  assert.deepEqual([...idx.tierOverlaps(prompt4, ["a"])!.host], [4], "all 4 GPU blocks offloaded");
  idx.applyEvents("a", decoded([["BlockRemoved", [Buffer.concat([c, d])], "CPU"]]));
  assert.deepEqual([...idx.tierOverlaps(prompt4, ["a"])!.host], [2]);
  assert.equal(idx.tierBlocks().host, 2);
});

test("GPU hashes sent as ints: the offloaded digests resolve by their low 64 bits", () => {
  const idx = new KvIndex();
  idx.addWorker("a", BS);
  const [a, b, c, d] = DIGESTS;
  idx.applyEvents("a", decoded([gpu(DIGESTS.map(low64)), cpu([Buffer.concat([a, b])], 2 * BS)]));
  assert.deepEqual([...idx.tierOverlaps(prompt4, ["a"])!.host], [2]);
  // k = 1 bytes against int GPU hashes too.
  idx.applyEvents("a", decoded([cpu([c, d], BS)]));
  assert.deepEqual([...idx.tierOverlaps(prompt4, ["a"])!.host], [4]);
});

test("no block_size (0): a hash of two digests is split; a digest that is not the GPU's is ignored", () => {
  const idx = new KvIndex();
  idx.addWorker("a", BS);
  const [a, b] = DIGESTS;
  const before = idx.counters.ignored;
  idx.applyEvents("a", decoded([gpu(DIGESTS), cpu([Buffer.concat([a, b])], 0)]));
  assert.deepEqual([...idx.tierOverlaps(prompt4, ["a"])!.host], [2]);
  idx.applyEvents("a", decoded([cpu([Buffer.concat([a, Buffer.alloc(32, 9)])], 2 * BS)]));
  assert.equal(idx.tierBlocks().host, 2, "a group with an unknown digest adds nothing");
  assert.ok(idx.counters.ignored > before);
});
