import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { blockHash, extendBlockHashes } from "../../../src/engine/sim/block-hash.ts";
import { BlockPool } from "../../../src/engine/sim/block-pool.ts";
import { offloadBlockFactor } from "../../../src/engine/sim/config.ts";
import type { BlockRemovedEvent, BlockStoredEvent } from "../../../src/engine/sim/kv-events.ts";

const range = (start: number, n: number): number[] => Array.from({ length: n }, (_, i) => start + i);

describe("block hash", () => {
  it("is chained, salted on the first block only, and 64-bit", () => {
    const t = range(1, 32);
    const h = extendBlockHashes([], t, 16, null);
    assert.equal(h.length, 2);
    assert.equal(h[1], blockHash(h[0], t, 16, 32, null));
    assert.notEqual(blockHash(null, t, 16, 32, null), h[1], "parent enters the hash");
    const salted = extendBlockHashes([], t, 16, "s");
    assert.notEqual(salted[0], h[0]);
    assert.notEqual(salted[1], h[1], "the salt reaches later blocks through the chain");
    for (const x of h) assert.ok(x >= 0n && x < 1n << 64n);
    assert.equal(extendBlockHashes([], range(1, 15), 16, null).length, 0, "partial blocks have no hash");
  });
});

describe("BlockPool", () => {
  it("allocates, frees into an LRU free queue, and counts usage", () => {
    const pool = new BlockPool(8, 4);
    const a = pool.allocate(3)!;
    assert.equal(a.length, 3);
    assert.equal(pool.numFree, 5);
    assert.equal(pool.usage(), 3 / 8);
    assert.equal(pool.allocate(6), null, "not enough blocks: nothing taken");
    assert.equal(pool.numFree, 5);
    pool.free(a);
    assert.equal(pool.numFree, 8);
    assert.equal(pool.usage(), 0);
  });

  it("caches full blocks (one BlockStored per run) and serves hits with ref counts", () => {
    const pool = new BlockPool(8, 4);
    const tokens = range(100, 12);
    const hashes = extendBlockHashes([], tokens, 4, null);
    const ids = pool.allocate(3)!;
    pool.cacheBlocks(ids, hashes, tokens, 0, 3, null);
    const ev = pool.drain();
    assert.equal(ev.length, 1);
    const st = ev[0] as BlockStoredEvent;
    assert.equal(st.type, "BlockStored");
    assert.deepEqual(st.blockHashes, hashes);
    assert.equal(st.parentBlockHash, null);
    assert.deepEqual(st.tokenIds, tokens);
    assert.equal(pool.lookup(hashes[1]), ids[1]);
    pool.touch(ids[0]);
    assert.equal(pool.refs(ids[0]), 2);
    pool.free(ids);
    assert.equal(pool.refs(ids[0]), 1);
    assert.equal(pool.numFree, 7);
    pool.free([ids[0]]);
    assert.equal(pool.numFree, 8);
    // Freed cached blocks keep their hash until evicted.
    assert.equal(pool.lookup(hashes[0]), ids[0]);
    pool.touch(ids[0]);
    assert.equal(pool.numFree, 7, "a hit takes the block off the free queue");
    pool.free([ids[0]]);
  });

  it("a duplicate hash is not cached twice (no duplicate event)", () => {
    const pool = new BlockPool(8, 4);
    const tokens = range(0, 4);
    const hashes = extendBlockHashes([], tokens, 4, null);
    const a = pool.allocate(1)!;
    const b = pool.allocate(1)!;
    pool.cacheBlocks(a, hashes, tokens, 0, 1, null);
    pool.cacheBlocks(b, hashes, tokens, 0, 1, null);
    assert.equal(pool.drain().length, 1);
    assert.equal(pool.lookup(hashes[0]), a[0]);
  });

  it("evicts least recently freed cached blocks first, emitting BlockRemoved, uncached blocks before cached", () => {
    const pool = new BlockPool(4, 2);
    const t1 = range(10, 4);
    const h1 = extendBlockHashes([], t1, 2, null);
    const b1 = pool.allocate(2)!;
    pool.cacheBlocks(b1, h1, t1, 0, 2, null);
    const t2 = range(50, 4);
    const h2 = extendBlockHashes([], t2, 2, null);
    const b2 = pool.allocate(2)!;
    pool.cacheBlocks(b2, h2, t2, 0, 2, null);
    pool.drain();
    pool.free(b1); // freed first: evicted first, tail block before the prefix block
    pool.free(b2);
    const got = pool.allocate(1)!;
    const ev = pool.drain();
    assert.equal(ev.length, 1);
    assert.deepEqual((ev[0] as BlockRemovedEvent).blockHashes, [h1[1]]);
    assert.equal(got[0], b1[1]);
    assert.equal(pool.lookup(h1[1]), undefined);
    assert.equal(pool.lookup(h1[0]), b1[0]);
    // An uncached free block goes before any cached one.
    pool.free(got);
    const again = pool.allocate(1)!;
    assert.equal(again[0], got[0]);
    assert.equal(pool.drain().length, 0, "evicting an uncached block emits nothing");
  });

  it("reset clears the cache with AllBlocksCleared, refused while blocks are in use", () => {
    const pool = new BlockPool(4, 2);
    const t = range(0, 2);
    const h = extendBlockHashes([], t, 2, null);
    const b = pool.allocate(1)!;
    pool.cacheBlocks(b, h, t, 0, 1, null);
    pool.drain();
    assert.equal(pool.reset(), false);
    pool.free(b);
    assert.equal(pool.reset(), true);
    assert.deepEqual(pool.drain(), [{ type: "AllBlocksCleared" }]);
    assert.equal(pool.lookup(h[0]), undefined);
  });

  it("salted first blocks carry the salt in extra_keys", () => {
    const pool = new BlockPool(4, 2);
    const t = range(0, 4);
    const h = extendBlockHashes([], t, 2, "tenant");
    const b = pool.allocate(2)!;
    pool.cacheBlocks(b, h, t, 0, 2, "tenant");
    const st = pool.drain()[0] as BlockStoredEvent;
    assert.deepEqual(st.extraKeys, [["tenant"], null]);
  });

  // vLLM's OffloadingConnector (offloading/scheduler.py take_events @
  // 0072b0b7443bdddf17824c78d4feae8e1fc12fb4): hash-only BlockStored / BlockRemoved with medium
  // "CPU" and the offloaded block_size; the hash of an offloaded block of k GPU blocks is their k
  // digests concatenated (vllm/v1/core/kv_cache_utils.py BlockHashListWithBlockSize @
  // 001cabc1be16a59a70d720ed61a13b678c060a18), sent as raw bytes.
  it("offloads whole groups of GPU blocks, named by their digests concatenated; evicts the oldest", () => {
    const pool = new BlockPool(16, 4, true, 2, 2);
    const tokens = range(300, 20); // 5 blocks: 2 whole groups
    const hashes = extendBlockHashes([], tokens, 4, null);
    const ids = pool.allocate(5)!;
    pool.cacheBlocks(ids, hashes, tokens, 0, 3, null); // group 0 complete, group 1 not yet
    const digest = (from: number, to: number) =>
      Buffer.concat(
        hashes.slice(from, to).map((h) => {
          const d = Buffer.alloc(32);
          d.writeBigUInt64BE(h, 24);
          return d;
        }),
      );
    const cpu = (evs: ReturnType<typeof pool.drain>) =>
      evs.filter((e) => e.type !== "AllBlocksCleared" && e.medium === "CPU") as (
        | BlockStoredEvent
        | BlockRemovedEvent
      )[];
    let ev = cpu(pool.drain());
    assert.equal(ev.length, 1);
    const st = ev[0] as BlockStoredEvent;
    assert.deepEqual([st.type, st.blockSize, st.tokenIds, st.parentBlockHash], ["BlockStored", 8, [], null]);
    assert.deepEqual(
      st.blockHashes.map((h) => Buffer.from(h as Uint8Array)),
      [digest(0, 2)],
    );
    pool.cacheBlocks(ids, hashes, tokens, 3, 5, null); // completes group 1; block 4 waits for a 6th
    ev = cpu(pool.drain());
    assert.deepEqual(
      (ev[0] as BlockStoredEvent).blockHashes.map((h) => Buffer.from(h as Uint8Array)),
      [digest(2, 4)],
    );
    // A third group past the CPU's 2 blocks drops the oldest, reported with its own hash.
    const other = range(900, 8);
    const oh = extendBlockHashes([], other, 4, null);
    pool.cacheBlocks(pool.allocate(2)!, oh, other, 0, 2, null);
    ev = cpu(pool.drain());
    const rm = ev.find((e) => e.type === "BlockRemoved") as BlockRemovedEvent;
    assert.deepEqual(
      rm.blockHashes.map((h) => Buffer.from(h as Uint8Array)),
      [digest(0, 2)],
    );
  });

  // vllm/v1/kv_offload/spec.py OffloadingSpec.__init__: block_size defaults to the GPU block
  // size and must be a multiple of it (an assert: the engine does not start).
  it("the offloaded block_size sets the group; one not a multiple of the GPU block size is refused", () => {
    const cfg = (extra: Record<string, unknown>) => ({
      kv_connector: "OffloadingConnector",
      kv_connector_extra_config: { num_cpu_blocks: 8, ...extra },
    });
    assert.equal(offloadBlockFactor(cfg({}), 16), 1);
    assert.equal(offloadBlockFactor(cfg({ block_size: 64 }), 16), 4);
    assert.throws(() => offloadBlockFactor(cfg({ block_size: 24 }), 16), /multiple of the GPU block size 16/);
  });
});
