import assert from "node:assert/strict";
import { test } from "node:test";
import type { BlockStored, KvEvent } from "../../src/kv/events.ts";
import { KvIndex, saltFromExtraKeys } from "../../src/kv/index.ts";
import { blockRemoved, blockStored } from "../helpers/kv-events.ts";

const BS = 4;
const prompt = Array.from({ length: 22 }, (_, i) => 500 + i); // 5 full blocks + 2 tokens

const stored = (
  hashes: number[],
  parent: number | null,
  tokenIds: number[],
  more: Partial<BlockStored> = {},
) => blockStored(hashes, tokenIds, BS, { parentBlockHash: parent, ...more });

test("blocks stored across chained events give each worker its cached prefix length", () => {
  const idx = new KvIndex();
  idx.addWorker("a", BS);
  idx.addWorker("b", BS);
  // Worker a: blocks 0-1 in one event, 2-3 chained by parent hash in a second one.
  idx.apply("a", stored([101, 102], null, prompt.slice(0, 8)));
  idx.apply("a", stored([103, 104], 102, prompt.slice(8, 16)));
  // Worker b: only the first block.
  idx.apply("b", stored([9001], null, prompt.slice(0, 4)));
  assert.deepEqual([...idx.overlaps(prompt, ["a", "b", "c"])], [4, 1, -1]);
  // A different prompt sharing two blocks.
  const other = [...prompt.slice(0, 8), 1, 2, 3, 4, 5, 6, 7, 8];
  assert.deepEqual([...idx.overlaps(other, ["a", "b"])], [2, 1]);
  assert.equal(idx.counters.stored, 5);
});

test("BlockRemoved by engine hash breaks the prefix at the removed block", () => {
  const idx = new KvIndex();
  idx.apply("a", stored([1, 2, 3, 4], null, prompt.slice(0, 16)), BS);
  idx.apply("a", blockRemoved([3, 4]));
  assert.deepEqual([...idx.overlaps(prompt, ["a"])], [2]);
  idx.apply("a", blockRemoved([1], { medium: null }));
  assert.deepEqual([...idx.overlaps(prompt, ["a"])], [0]);
  idx.apply("a", blockRemoved([77], { medium: null }));
  assert.equal(idx.counters.unknownRemovals, 1);
  // CPU-medium removals do not touch GPU blocks.
  idx.apply("a", stored([11, 12], null, prompt.slice(0, 8)));
  idx.apply("a", blockRemoved([11], { medium: "CPU" }));
  assert.deepEqual([...idx.overlaps(prompt, ["a"])], [2]);
});

test("AllBlocksCleared, removeWorker and orphans", () => {
  const idx = new KvIndex();
  idx.apply("a", stored([1, 2], null, prompt.slice(0, 8)), BS);
  idx.apply("a", { type: "AllBlocksCleared" });
  assert.deepEqual([...idx.overlaps(prompt, ["a"])], [0]);
  // A child whose parent the index never saw cannot be hashed: counted, skipped.
  idx.apply("a", stored([3], 2, prompt.slice(8, 12)));
  assert.equal(idx.counters.orphans, 1);
  assert.equal(idx.blockCount("a"), 0);
  idx.removeWorker("a");
  assert.deepEqual([...idx.overlaps(prompt, ["a"])], [-1]);
});

test("cache_salt in the first block's extra keys isolates tenants", () => {
  const idx = new KvIndex();
  idx.apply("a", stored([1, 2, 3], null, prompt.slice(0, 12), { extraKeys: [["tenant-1"], null, null] }), BS);
  idx.apply("b", stored([1, 2, 3], null, prompt.slice(0, 12)), BS);
  assert.deepEqual([...idx.overlaps(prompt, ["a", "b"], "tenant-1")], [3, 0]);
  assert.deepEqual([...idx.overlaps(prompt, ["a", "b"], "tenant-2")], [0, 0]);
  assert.deepEqual([...idx.overlaps(prompt, ["a", "b"])], [0, 3]);
  assert.equal(saltFromExtraKeys([["mm-hash", "s"], null]), "s");
  assert.equal(saltFromExtraKeys(["s"]), "s");
  assert.equal(saltFromExtraKeys([null, null]), null);
  assert.equal(saltFromExtraKeys({ cache_salt: "z" }), "z");
});

test("workers with different block sizes are matched on their own boundaries", () => {
  const idx = new KvIndex();
  idx.apply("a", stored([1, 2], null, prompt.slice(0, 8)), BS);
  idx.apply("b", stored([1], null, prompt.slice(0, 8), { blockSize: 8 }), 8);
  assert.deepEqual([...idx.overlaps(prompt, ["a", "b"])], [2, 1]);
  assert.equal(idx.blockSizeOf("b"), 8);
});

test("re-storing an engine hash with new tokens replaces the old block", () => {
  const idx = new KvIndex();
  idx.apply("a", stored([1], null, [9, 9, 9, 9]), BS);
  idx.apply("a", stored([1], null, prompt.slice(0, 4)), BS);
  assert.equal(idx.blockCount("a"), 1);
  assert.deepEqual([...idx.overlaps(prompt, ["a"])], [1]);
});

test("candidateRows: block size, held blocks and sync per candidate in one pass, as the per-id reads say", () => {
  const idx = new KvIndex();
  idx.addWorker("a", BS);
  idx.addWorker("b", 8);
  idx.addWorker("s", BS);
  idx.apply("a", stored([101, 102], null, prompt.slice(0, 8)));
  idx.apply("a", stored([201], null, prompt.slice(0, 4)), BS, 1); // a second DP rank
  idx.apply("s", stored([301], null, prompt.slice(0, 4)));
  idx.setSync("s", 0, "syncing");
  const ids = ["a", "b", "gone", "s"];
  const rows = () => {
    const bs = new Int32Array(ids.length);
    const held = new Int32Array(ids.length);
    const sync = new Uint8Array(ids.length);
    idx.candidateRows(ids, bs, held, sync);
    return { bs: [...bs], held: [...held], sync: [...sync] };
  };
  // Walked first, so the rows come from the list the walk resolved (the decision's order).
  idx.overlaps(prompt, ids);
  const expected = () => ({
    bs: ids.map((id) => idx.blockSizeOf(id) ?? 0),
    held: ids.map((id) => (idx.hasWorker(id) ? idx.blockCount(id) : -1)),
    sync: ids.map((id) => [null, "syncing", "synced", "unknown"].indexOf(idx.syncOf(id))),
  });
  assert.deepEqual(rows(), { bs: [4, 8, 0, 4], held: [3, 0, -1, -1], sync: [2, 2, 0, 1] });
  assert.deepEqual(rows(), expected());
  // Blocks move between two decisions over the same list: the counts are read again, not kept.
  idx.apply("b", stored([401], null, prompt.slice(0, 8), { blockSize: 8 }));
  idx.apply("a", blockRemoved([102]));
  idx.setSync("s", 0, "synced");
  // A one-worker probe in between (the bridge's confirmation) leaves the fleet's list alone.
  idx.overlaps(prompt, ["b"]);
  assert.deepEqual(rows(), { bs: [4, 8, 0, 4], held: [2, 1, -1, 1], sync: [2, 2, 0, 2] });
  assert.deepEqual(rows(), expected());
  // The counts follow every way blocks leave: a cleared rank, AllBlocksCleared, an adopted block.
  idx.clearWorker("a", 1);
  idx.apply("b", { type: "AllBlocksCleared", medium: null } as KvEvent);
  idx.adopt("s", 0, BS, 302, 7, 9);
  assert.deepEqual(rows(), { bs: [4, 8, 0, 4], held: [1, 0, -1, 2], sync: [2, 2, 0, 2] });
  assert.deepEqual(rows(), expected());
  // A worker that comes or goes is seen at once.
  idx.removeWorker("a");
  idx.addWorker("gone", 16);
  assert.deepEqual(rows(), { bs: [0, 8, 16, 4], held: [-1, 0, 0, 2], sync: [0, 2, 2, 2] });
  assert.deepEqual(rows(), expected());
});
