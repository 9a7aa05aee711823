/**
 * BlockTable across many entry pages: random acquire / release against a Map of multisets, with
 * more entries than several pages hold, so page boundaries, the free list and bucket rehashes
 * are all crossed (the index tests stay within the first page).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { BlockTable } from "../../src/kv/block-table.ts";

function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return x >>> 0;
  };
}

test("entries on many pages keep their keys and holders under churn", () => {
  const t = new BlockTable();
  const r = rng(7);
  // key "lo:hi" -> holders (multiset) and the entry id the table gave it
  const model = new Map<string, { lo: number; hi: number; holders: number[]; id: number }>();
  const keys: string[] = [];
  for (let step = 0; step < 120_000; step++) {
    const grow = step < 60_000 || r() % 3 !== 0;
    if (grow || keys.length === 0) {
      // Reuse an existing key now and then (a shared block), else a fresh one.
      const reuse = keys.length > 0 && r() % 5 === 0;
      const key = reuse ? keys[r() % keys.length] : `${r()}:${r()}`;
      const [lo, hi] = key.split(":").map(Number);
      const holder = r() % 40;
      const id = t.acquire(lo, hi, holder);
      const m = model.get(key);
      if (m) {
        assert.equal(id, m.id);
        m.holders.push(holder);
      } else {
        model.set(key, { lo, hi, holders: [holder], id });
        keys.push(key);
      }
    } else {
      const i = r() % keys.length;
      const key = keys[i];
      const m = model.get(key)!;
      const h = m.holders.splice(r() % m.holders.length, 1)[0];
      t.release(m.id, h);
      if (m.holders.length === 0) {
        model.delete(key);
        keys[i] = keys[keys.length - 1];
        keys.pop();
      }
    }
  }
  assert.ok(model.size > 30_000, "several pages of live entries");
  assert.equal(t.size, model.size);
  const marks = new Uint32Array(64);
  const chain = new Uint32Array(2);
  for (const m of model.values()) {
    assert.equal(t.find(m.lo, m.hi), m.id);
    assert.equal(t.loOf(m.id), m.lo);
    assert.equal(t.hiOf(m.id), m.hi);
    // A one-block walk moves exactly the holders of the block.
    marks.fill(5);
    chain[0] = m.lo;
    chain[1] = m.hi;
    assert.equal(t.walk(chain, 1, marks, 5), 1);
    const moved = [...marks.keys()].filter((h) => marks[h] === 6).sort((a, b) => a - b);
    assert.deepEqual(
      moved,
      [...new Set(m.holders)].sort((a, b) => a - b),
    );
  }
});

test("the walk's next-entry guess never takes a freed neighbour or a stale key", () => {
  const t = new BlockTable();
  // A chain of 6 blocks stored in order: consecutive entries, held by holder 0.
  const chain = new Uint32Array(12);
  for (let k = 0; k < 6; k++) {
    chain[2 * k] = 0x1000 + k * 0x10001;
    chain[2 * k + 1] = 0xabc0 + k;
  }
  const ids: number[] = [];
  for (let k = 0; k < 6; k++) ids.push(t.acquire(chain[2 * k], chain[2 * k + 1], 0));
  const other = t.acquire(0x7777, 0x8888, 5);
  assert.deepEqual(
    ids.map((id) => id - ids[0]),
    [0, 1, 2, 3, 4, 5],
  );
  const marks = new Uint32Array(8);
  const walk = (base: number) => {
    marks.fill(0);
    marks[0] = base;
    marks[1] = base;
    return t.walk(chain, 6, marks, base);
  };
  assert.equal(walk(10), 6);
  assert.equal(marks[0], 16);
  // Block 3 dropped: its entry is freed but keeps its old key words; the guess from block 2
  // must not take it, and the walk stops at 3.
  t.release(ids[3], 0);
  assert.equal(walk(20), 3);
  assert.equal(marks[0], 23);
  // Block 3 held again by holder 0, in another entry: free an unrelated entry after it, so the
  // free list (last in, first out) hands that one out and the old entry of block 3 stays freed
  // with its stale key. The guess from block 2 meets the stale entry first and must pass it by;
  // the bucket finds the live one, and the walk reaches the end again.
  t.release(other, 5);
  const again = t.acquire(chain[6], chain[7], 0);
  assert.equal(again, other);
  assert.equal(t.loOf(ids[3]), chain[6], "the freed entry keeps its stale key");
  assert.equal(walk(30), 6);
  assert.equal(marks[0], 36);
  // Holder 1 holds block 0 only: it stops at 1 while holder 0 goes on.
  t.acquire(chain[0], chain[1], 1);
  assert.equal(walk(40), 6);
  assert.equal(marks[0], 46);
  assert.equal(marks[1], 41);
});

test("a table with maxId hands out no id past it: a new hash gets 0, known ones still acquire", () => {
  // The index makes its table with maxId = EngineBlockMap's MAX_VALUE (28-bit entry ids).
  const t = new BlockTable(3);
  const ids = [t.acquire(10, 1, 0), t.acquire(11, 1, 0), t.acquire(12, 1, 0)];
  assert.deepEqual(ids, [1, 2, 3]);
  assert.equal(t.acquire(13, 1, 0), 0, "a fourth distinct hash is refused");
  assert.equal(t.find(13, 1), 0, "and left no entry behind");
  assert.equal(t.size, 3);
  assert.equal(t.acquire(11, 1, 5), 2, "a hash already held takes one more holder");
  t.release(1, 0);
  assert.equal(t.acquire(13, 1, 0), 1, "a freed id is handed out again");
  assert.equal(t.size, 3);
});
