/**
 * The index keeps the flattened candidate list (src/kv/walk.ts WalkPlan) between matches with
 * the same worker ids. These pin that it is rebuilt whenever what it flattened changes: a new
 * DP rank, a cleared rank, a worker's block size, a worker coming back.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { KvIndex } from "../../src/kv/index.ts";
import { blockStored } from "../helpers/kv-events.ts";

test("a cached candidate list follows new ranks, cleared ranks and block sizes", () => {
  const idx = new KvIndex();
  const toks = Array.from({ length: 64 }, (_, i) => i + 1);
  const ids = ["a", "b", "gone"];
  const best = new Int32Array(ids.length);
  idx.applyEvents("a", [blockStored([1, 2], toks.slice(0, 8), 4)], 4, 0);
  idx.applyEvents("b", [blockStored([5], toks.slice(0, 4), 4)], 4, 0);
  assert.deepEqual([...idx.overlaps(toks, ids, null, null, best)], [2, 1, -1]);
  // A second rank of "a" appears with a longer prefix: the same ids must see it.
  idx.applyEvents("a", [blockStored([3, 4, 5, 6, 7], toks.slice(0, 20), 4)], 4, 3);
  assert.deepEqual([...idx.overlaps(toks, ids, null, null, best)], [5, 1, -1]);
  assert.deepEqual([...best], [3, 0, -1]);
  // That rank is cleared: back to rank 0's two blocks.
  idx.clearWorker("a", 3);
  assert.deepEqual([...idx.overlaps(toks, ids, null, null, best)], [2, 1, -1]);
  assert.deepEqual([...best], [0, 0, -1]);
  // "b" turns out to use 8-token blocks: it is walked at that size from now on.
  idx.applyEvents("b", [blockStored([9, 10, 11], toks.slice(0, 24), 8)], 8, 1);
  assert.equal(idx.blockSizeOf("b"), 8);
  assert.deepEqual([...idx.overlaps(toks, ids, null, null, best)], [2, 3, -1]);
  assert.deepEqual([...best], [0, 1, -1]);
  // A worker that was unknown arrives.
  idx.applyEvents("gone", [blockStored([20], toks.slice(0, 4), 4)], 4, 0);
  assert.deepEqual([...idx.overlaps(toks, ids)], [2, 3, 1]);
  idx.removeWorker("gone");
  assert.deepEqual([...idx.overlaps(toks, ids)], [2, 3, -1]);
});
