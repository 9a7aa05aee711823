/**
 * The one-walk index (src/kv/index.ts over src/kv/block-table.ts) against the frozen per-worker
 * index it replaced (bench/kv-index/baseline): the same events give the same overlaps, best
 * ranks, block counts and counters, through DP ranks, caps, removals, clears, LoRA and salts and
 * mixed block sizes. And the widened 64-bit router hash: two prompts whose 32-bit hashes collide
 * no longer match each other.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { hashPrompt as hashPrompt32 } from "../../bench/kv-index/baseline/hash.ts";
import { KvIndex as BaselineIndex } from "../../bench/kv-index/baseline/index.ts";
import type { BlockStored, EngineBlockHash, KvEvent } from "../../src/kv/events.ts";
import { hashPrompt, type RouterBlockHash, routerHashAt } from "../../src/kv/hash.ts";
import { KvIndex } from "../../src/kv/index.ts";
import { blockRemoved, blockStored } from "../helpers/kv-events.ts";

function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
}

const stored = (
  hashes: number[],
  parent: number | null,
  tokenIds: number[],
  blockSize: number,
  more: Partial<BlockStored> = {},
) => blockStored(hashes, tokenIds, blockSize, { parentBlockHash: parent, ...more });

interface Seq {
  tokens: number[];
  hashes: number[];
  salt: string | null;
  lora: string | null;
}

const WORKERS = ["w0", "w1", "w2", "w3", "w4", "w5"];
const BLOCK_SIZE: Record<string, number> = { w0: 4, w1: 4, w2: 4, w3: 4, w4: 8, w5: 2 };
const SALTS = [null, null, "tenant-a"];
const LORAS = [null, null, "adapter-x"];

test("one walk gives the per-worker index's overlaps, best ranks and counters under random churn", () => {
  const rnd = rng(20261203);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)];
  const oldIdx = new BaselineIndex();
  const newIdx = new KvIndex();
  // A few documents with a tiny alphabet, so prompts share prefixes across workers and ranks.
  const docs = Array.from({ length: 5 }, () => Array.from({ length: 64 }, () => Math.floor(rnd() * 3)));
  const seqs = new Map<string, Seq[]>();
  let engineHash = 1;
  const both = (fn: (idx: BaselineIndex | KvIndex) => void) => {
    fn(oldIdx);
    fn(newIdx);
  };
  for (const id of WORKERS) {
    // w3's pool is small (kvBlocks 8 → cap 10 per rank), so the cap is reached.
    both((idx) => idx.addWorker(id, BLOCK_SIZE[id], 0, id === "w3" ? 8 : undefined));
  }
  const apply = (id: string, rank: number, ev: KvEvent) => both((idx) => idx.applyEvents(id, [ev], 4, rank));

  for (let step = 0; step < 4000; step++) {
    const id = pick(WORKERS);
    const rank = Math.floor(rnd() * 3);
    const key = `${id}/${rank}`;
    const list = seqs.get(key) ?? [];
    seqs.set(key, list);
    const bs = BLOCK_SIZE[id];
    const r = rnd();
    if (r < 0.45 || list.length === 0) {
      // A new sequence from a document's start (parent null), 1-6 blocks.
      const doc = pick(docs);
      const n = 1 + Math.floor(rnd() * 6);
      const seq: Seq = { tokens: doc.slice(0, n * bs), hashes: [], salt: pick(SALTS), lora: pick(LORAS) };
      for (let i = 0; i < n; i++) seq.hashes.push(engineHash++);
      list.push(seq);
      apply(
        id,
        rank,
        stored(seq.hashes, null, seq.tokens, bs, {
          loraName: seq.lora,
          extraKeys: seq.salt === null ? null : [[...(seq.lora ? [seq.lora] : []), seq.salt]],
        }),
      );
    } else if (r < 0.7) {
      // Extend a sequence by parent hash (it may have been removed meanwhile: an orphan).
      const seq = pick(list);
      const n = 1 + Math.floor(rnd() * 3);
      const more = Array.from({ length: n * bs }, () => Math.floor(rnd() * 3));
      const hashes = Array.from({ length: n }, () => engineHash++);
      apply(id, rank, stored(hashes, seq.hashes[seq.hashes.length - 1], more, bs, { loraName: seq.lora }));
      seq.tokens.push(...more);
      seq.hashes.push(...hashes);
    } else if (r < 0.9) {
      // Evict a few blocks (some never stored: unknown removals).
      const seq = pick(list);
      const hashes = seq.hashes.filter(() => rnd() < 0.3);
      if (rnd() < 0.1) hashes.push(999_999_999);
      apply(id, rank, blockRemoved(hashes));
    } else if (r < 0.94) {
      // The engine reuses a hash for other tokens.
      const seq = pick(list);
      apply(id, rank, stored([seq.hashes[0]], null, pick(docs).slice(8, 8 + bs), bs));
    } else if (r < 0.96) {
      apply(id, rank, { type: "AllBlocksCleared" });
      seqs.set(key, []);
    } else if (r < 0.97) {
      both((idx) => idx.clearWorker(id, rank));
      seqs.set(key, []);
    } else if (r < 0.975) {
      both((idx) => idx.removeWorker(id));
      both((idx) => idx.addWorker(id, bs, 0, id === "w3" ? 8 : undefined));
      for (let k = 0; k < 3; k++) seqs.set(`${id}/${k}`, []);
    }

    if (step % 20 === 0) {
      const ids = [...WORKERS, "unknown"];
      for (let q = 0; q < 6; q++) {
        const doc = pick(docs);
        const prompt = doc.slice(0, Math.floor(rnd() * 64));
        const salt = pick(SALTS);
        const lora = pick(LORAS);
        const rOld = new Int32Array(ids.length);
        const rNew = new Int32Array(ids.length);
        const a = oldIdx.overlaps(prompt, ids, salt, lora, rOld);
        const b = newIdx.overlaps(prompt, ids, salt, lora, rNew);
        assert.deepEqual([...b], [...a], `overlaps at step ${step}`);
        assert.deepEqual([...rNew], [...rOld], `best ranks at step ${step}`);
      }
      for (const id of WORKERS) {
        assert.equal(newIdx.blockCount(id), oldIdx.blockCount(id), `${id} blocks at step ${step}`);
        for (let k = 0; k < 3; k++) assert.equal(newIdx.blockCount(id, k), oldIdx.blockCount(id, k));
      }
    }
  }
  assert.deepEqual(newIdx.counters, oldIdx.counters);
  // The walk saw every path: DP ranks, caps, orphans, removals, clears.
  const c = newIdx.counters;
  assert.ok(
    c.capped > 0 && c.orphans > 0 && c.removed > 0 && c.unknownRemovals > 0 && c.cleared > 0,
    JSON.stringify(c),
  );
  assert.ok(newIdx.isLora("adapter-x"));
});

test("DP ranks: the best rank is the one holding the longest prefix, per worker in one walk", () => {
  const idx = new KvIndex();
  const toks = Array.from({ length: 32 }, (_, i) => i + 1);
  idx.applyEvents("a", [stored([1, 2], null, toks.slice(0, 8), 4)], 4, 0);
  idx.applyEvents("a", [stored([1, 2, 3, 4], null, toks.slice(0, 16), 4)], 4, 2);
  idx.applyEvents("b", [stored([7, 8, 9], null, toks.slice(0, 12), 4)], 4, 1);
  const best = new Int32Array(3);
  assert.deepEqual([...idx.overlaps(toks, ["a", "b", "c"], null, null, best)], [4, 3, -1]);
  assert.deepEqual([...best], [2, 1, -1]);
  // Rank 2 clears: rank 0's two blocks are what is left.
  idx.applyEvents("a", [{ type: "AllBlocksCleared" }], 4, 2);
  assert.deepEqual([...idx.overlaps(toks, ["a"], null, null, best)], [2]);
  assert.equal(best[0], 0);
  // Removing one worker leaves the other's blocks (a shared entry loses one holder only).
  idx.applyEvents("b", [stored([1, 2], null, toks.slice(0, 8), 4)], 4, 0);
  idx.removeWorker("a");
  assert.deepEqual([...idx.overlaps(toks, ["a", "b"])], [-1, 3]);
  idx.clearWorker("b", 1);
  assert.deepEqual([...idx.overlaps(toks, ["b"], null, null, best)], [2]);
  assert.equal(best[0], 0);
  idx.clearWorker("b");
  assert.deepEqual([...idx.overlaps(toks, ["b"], null, null, best)], [0]);
  assert.equal(best[0], -1);
  assert.equal(idx.distinctBlocks(), 0);
});

test("a block two ranks of one worker both hold, with one router hash twice on a rank, is a multiset", () => {
  const idx = new KvIndex();
  const toks = [5, 6, 7, 8];
  // Two engine hashes for the same tokens on one rank (e.g. extra keys the router does not hash).
  idx.applyEvents("a", [stored([1], null, toks, 4), stored([2], null, toks, 4)], 4, 0);
  assert.equal(idx.blockCount("a"), 2);
  assert.equal(idx.distinctBlocks(), 1);
  idx.applyEvents("a", [blockRemoved([1])], 4, 0);
  assert.deepEqual([...idx.overlaps(toks, ["a"])], [1]);
  idx.applyEvents("a", [blockRemoved([2])], 4, 0);
  assert.deepEqual([...idx.overlaps(toks, ["a"])], [0]);
  assert.equal(idx.distinctBlocks(), 0);
});

test("many holders of one block: the shared holder list grows and shrinks", () => {
  const idx = new KvIndex();
  const toks = Array.from({ length: 8 }, (_, i) => 40 + i);
  const ids = Array.from({ length: 40 }, (_, i) => `w${i}`);
  ids.forEach((id, i) => {
    idx.apply(id, stored([i + 1, 1000 + i], null, toks, 4), 4);
  });
  assert.deepEqual(
    [...idx.overlaps(toks, ids)],
    ids.map(() => 2),
  );
  // Every other worker evicts the second block.
  ids.forEach((id, i) => {
    if (i % 2) idx.apply(id, blockRemoved([1000 + i]));
  });
  assert.deepEqual(
    [...idx.overlaps(toks, ids)],
    ids.map((_, i) => (i % 2 ? 1 : 2)),
  );
  for (const id of ids.slice(0, 39)) idx.removeWorker(id);
  assert.deepEqual([...idx.overlaps(toks, ["w39", "w0"])], [1, -1]);
  assert.equal(idx.distinctBlocks(), 1);
});

/**
 * Two different one-block prompts whose 32-bit router hashes (the old index's) are equal,
 * found by a birthday search over 4-token blocks (about 2^16 tries).
 */
function colliding32(): [number[], number[]] {
  const seen = new Map<number, number>();
  for (let i = 0; ; i++) {
    const toks = [i & 0xff, (i >>> 8) & 0xff, (i >>> 16) & 0xff, 7];
    const h = hashPrompt32(toks, 4)[0];
    const j = seen.get(h);
    if (j !== undefined) return [[j & 0xff, (j >>> 8) & 0xff, (j >>> 16) & 0xff, 7], toks];
    seen.set(h, i);
  }
}

test("64-bit router hashes: prompts whose 32-bit hashes collide do not fake a hit", () => {
  const [a, b] = colliding32();
  assert.notDeepEqual(a, b);
  assert.equal(hashPrompt32(a, 4)[0], hashPrompt32(b, 4)[0]);
  const oldIdx = new BaselineIndex();
  const newIdx = new KvIndex();
  for (const idx of [oldIdx, newIdx]) idx.apply("w", stored([1], null, a, 4), 4);
  // The old index took prompt b for cached; the new one does not.
  assert.deepEqual([...oldIdx.overlaps(b, ["w"])], [1]);
  assert.deepEqual([...newIdx.overlaps(b, ["w"])], [0]);
  assert.deepEqual([...newIdx.overlaps(a, ["w"])], [1]);
  const ha: RouterBlockHash = routerHashAt(hashPrompt(a, 4), 0);
  assert.notEqual(ha, routerHashAt(hashPrompt(b, 4), 0));
});

test("engine and router block hashes are distinct types", () => {
  const chain = hashPrompt([1, 2, 3, 4], 4);
  const r = routerHashAt(chain, 0);
  // @ts-expect-error a router hash is not an engine hash
  const e: EngineBlockHash = r;
  const eh: EngineBlockHash = 42;
  // @ts-expect-error an engine hash is not a router hash
  const back: RouterBlockHash = eh;
  // @ts-expect-error a plain Uint32Array is not a router hash chain
  const notChain: ReturnType<typeof hashPrompt> = new Uint32Array(2);
  assert.equal(typeof e, "bigint");
  assert.equal(typeof back, "number");
  assert.equal(notChain.length, 2);
});

test("the reused candidate list follows workers that come and go, and ids changed in place", () => {
  const idx = new KvIndex();
  const toks = [1, 2, 3, 4, 5, 6, 7, 8];
  const ids = ["a", "b"];
  idx.apply("a", stored([1, 2], null, toks, 4), 4);
  assert.deepEqual([...idx.overlaps(toks, ids)], [2, -1]);
  idx.apply("b", stored([3], null, toks, 4), 4);
  assert.deepEqual([...idx.overlaps(toks, ids)], [2, 1]);
  idx.removeWorker("a");
  assert.deepEqual([...idx.overlaps(toks, ids)], [-1, 1]);
  ids[0] = "b";
  assert.deepEqual([...idx.overlaps(toks, ids)], [1, 1]);
});
