import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ARENA_GRANULE, ArenaAllocator, type Extent } from "../../src/kvd/allocator.ts";

const MiB = 1024 * 1024;

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

describe("arena allocator", () => {
  it("never overlaps, and coalesces back to one extent under mixed-size churn", () => {
    const cap = 256 * MiB;
    const a = new ArenaAllocator(cap);
    const r = rng(7);
    const sizes = [512 * 1024, 1 * MiB, 2 * MiB + 4096, 4 * MiB, 16 * MiB, 32 * MiB, 300_000];
    const live: Extent[] = [];
    let failures = 0;
    for (let step = 0; step < 20000; step++) {
      if (live.length > 0 && (r() < 0.45 || a.used > cap * 0.9)) {
        const i = Math.floor(r() * live.length);
        a.free(live[i]!);
        live.splice(i, 1);
        continue;
      }
      const size = sizes[Math.floor(r() * sizes.length)]!;
      const e = a.alloc(size);
      if (!e) {
        failures++;
        // The point of the design: failure only happens when there truly is no room.
        assert.ok(a.largestFree() < ArenaAllocator.rounded(size));
        continue;
      }
      assert.equal(e.offset % ARENA_GRANULE, 0);
      assert.ok(e.offset + e.size <= cap);
      live.push(e);
    }
    const sorted = [...live].sort((x, y) => x.offset - y.offset);
    for (let i = 1; i < sorted.length; i++) {
      assert.ok(sorted[i - 1]!.offset + sorted[i - 1]!.size <= sorted[i]!.offset, "extents overlap");
    }
    for (const e of live) a.free(e);
    assert.equal(a.used, 0);
    assert.equal(a.freeExtents, 1, "all free space merged into one extent");
    assert.equal(a.largestFree(), cap);
    assert.ok(failures < 2000, `too many failures: ${failures}`);
  });

  it("rounds only to the page, not to a power of two", () => {
    const a = new ArenaAllocator(64 * MiB);
    const e = a.alloc(17 * MiB + 1)!;
    assert.equal(e.size, 17 * MiB + ARENA_GRANULE);
    assert.ok(a.alloc(40 * MiB), "a buddy allocator would have used 32 MiB for the first chunk");
  });
});

describe("AIS probe", () => {
  it("reports off, with a reason, when the hipFile library is absent or not requested", async () => {
    const { probeAis } = await import("../../src/kvd/ais.ts");
    const off = probeAis(false);
    assert.equal(off.active, false);
    assert.match(off.reason, /INFERA_KVD_AIS/);
    const on = probeAis(true);
    assert.equal(on.requested, true);
    assert.equal(on.active, false, "never claims GPU-direct I/O");
    if (!on.available) assert.match(on.reason, /hipFile library not found/);
  });
});

describe("size parsing", () => {
  it("accepts binary suffixes and rejects junk", async () => {
    const { parseSize } = await import("../../src/kvd/size.ts");
    assert.equal(parseSize("64MiB"), 64 * MiB);
    assert.equal(parseSize("1GiB"), 1024 * MiB);
    assert.equal(parseSize("512k"), 512 * 1024);
    assert.equal(parseSize("4096"), 4096);
    assert.throws(() => parseSize("12 parsecs"));
  });
});
