/**
 * Offloaded KV tiers in the index and in kv-prefix (issue #29 item 6). The events are shaped as
 * vLLM's offloading connector sends them (vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py @
 * 0072b0b7443bdddf17824c78d4feae8e1fc12fb4, take_events: BlockStored with the backend's medium,
 * "CPU" for CPULoadStoreSpec, the engine's block hashes, token_ids=[], parent_block_hash=None;
 * BlockRemoved with the same medium), after the GPU's own BlockStored of the same hashes.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { KvEvent } from "../../src/kv/events.ts";
import { KvIndex } from "../../src/kv/index.ts";
import { scorers } from "../../src/router/pipeline/registry.ts";
import type { ModelScope, StepContext } from "../../src/router/pipeline/types.ts";
import type { RoutingRequest } from "../../src/router/types.ts";
import { createLogger } from "../../src/util/log.ts";
import { makeWorker } from "../router/pipeline/recorder.ts";

const BS = 4;
const prompt = Array.from({ length: 22 }, (_, i) => 700 + i); // 5 full blocks
const HASHES = [11, 12, 13, 14, 15];

const gpuStored = (): KvEvent => ({
  type: "BlockStored",
  blockHashes: HASHES,
  parentBlockHash: null,
  tokenIds: prompt.slice(0, 20),
  blockSize: BS,
  loraId: null,
  medium: "GPU",
  loraName: null,
  extraKeys: null,
  groupIdx: null,
});
const offloaded = (hashes: number[], medium = "CPU"): KvEvent => ({
  type: "BlockStored",
  blockHashes: hashes,
  parentBlockHash: null,
  tokenIds: [],
  blockSize: BS,
  loraId: null,
  medium,
  loraName: null,
  extraKeys: null,
  groupIdx: null,
});
const removed = (hashes: number[], medium: string): KvEvent => ({
  type: "BlockRemoved",
  blockHashes: hashes,
  medium,
  groupIdx: null,
});

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
    overlaps: () => s.overlapSource!.overlaps(c).overlaps,
    ranks: () => new Int32Array(3).fill(-1),
    bridged: () => null,
    blockSize: () => BS,
    promptBlocks: () => 5,
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
