import assert from "node:assert/strict";
import { test } from "node:test";
import { EngineBlockMap, MAX_VALUE } from "../../src/kv/engine-block-map.ts";

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return s;
  };
}

/**
 * Keys of every kind the decoders hand the index: exact 52-bit integers (vLLM's default sha256
 * block hashes are bytes, folded into 52 bits by src/kv/event-model.ts foldRange), rounded
 * uint64s, negative int64s (SGLang's page hashes: `hash_str_to_int64(node.hash_value[i])` in
 * python/sglang/srt/mem_cache/radix_cache.py, sgl-project/sglang @ 006b0e3d), floats.
 */
function keyOf(kind: number, n: number): number {
  switch (kind % 5) {
    case 0:
      return n; // small integers
    case 1:
      return 4503599627370495 - n * 4099; // just below 2^52: bits 32–51 set
    case 2:
      return 2 ** 63 + n * 2048; // a uint64 as msgpack decodes it, rounded to a double
    case 3:
      return -(n * 1e9) - 1; // a negative int64
    default:
      return n * 1e9 + 0.5; // not an integer
  }
}

test("EngineBlockMap agrees with a Map under random churn, across growth", () => {
  const rnd = lcg(12345);
  const map = new EngineBlockMap();
  const ref = new Map<number, number>();
  for (let i = 0; i < 80000; i++) {
    const n = rnd() % 4000;
    const key = keyOf(rnd(), n);
    const op = rnd() % 3;
    const slot = map.find(key);
    assert.equal(slot >= 0, ref.has(key), `find ${key}`);
    if (slot >= 0) assert.equal(map.valueAt(slot), ref.get(key));
    if (op < 2) {
      const value = rnd() % (MAX_VALUE + 1);
      assert.equal(map.set(key, value), slot < 0);
      ref.set(key, value);
    } else if (slot >= 0) {
      map.deleteAt(slot);
      ref.delete(key);
    }
    assert.equal(map.size, ref.size);
  }
  for (const [key, value] of ref) assert.equal(map.valueAt(map.find(key)), value);
  const seen: number[] = [];
  map.forEachValue((v) => seen.push(v));
  assert.deepEqual(
    seen.sort((a, b) => a - b),
    [...ref.values()].sort((a, b) => a - b),
  );
  map.clear();
  assert.equal(map.size, 0);
  for (const key of ref.keys()) assert.equal(map.find(key), -1);
});

test("integer keys below 2^52 are exact: keys one bit apart never meet", () => {
  const map = new EngineBlockMap(64);
  const base = 0x5a5a5a5a5a5a5; // 51 bits
  map.insertNew(base, 7);
  for (let b = 0; b < 52; b++) {
    const key = b < 32 ? base + (((base >>> b) & 1) === 1 ? -(2 ** b) : 2 ** b) : base + 2 ** b;
    assert.equal(map.find(key), -1, `bit ${b}`);
    map.insertNew(key, 100 + b);
  }
  assert.equal(map.size, 53);
  assert.equal(map.valueAt(map.find(base)), 7);
  for (let b = 0; b < 52; b++) {
    const key = b < 32 ? base + (((base >>> b) & 1) === 1 ? -(2 ** b) : 2 ** b) : base + 2 ** b;
    assert.equal(map.valueAt(map.find(key)), 100 + b, `bit ${b}`);
  }
  // The largest exact key and zero.
  map.insertNew(2 ** 52 - 1, 1);
  map.insertNew(0, 2);
  assert.equal(map.valueAt(map.find(2 ** 52 - 1)), 1);
  assert.equal(map.valueAt(map.find(0)), 2);
  assert.equal(map.find(2 ** 52 - 2), -1);
});

test("values keep all 28 bits up to MAX_VALUE; larger ones are refused", () => {
  const map = new EngineBlockMap();
  const values = [0, 1, 0xfff, 0x1000, 0xabcdef, MAX_VALUE - 1, MAX_VALUE];
  for (const [i, v] of values.entries()) map.insertNew(1000 + i, v);
  for (const [i, v] of values.entries()) assert.equal(map.valueAt(map.find(1000 + i)), v);
  const slot = map.find(1000);
  map.setAt(slot, MAX_VALUE);
  assert.equal(map.valueAt(slot), MAX_VALUE);
  assert.equal(map.valueAt(map.find(1001)), 1, "a neighbour keeps its value");
  assert.throws(() => map.insertNew(5, MAX_VALUE + 1), RangeError);
  assert.throws(() => map.setAt(slot, -1), RangeError);
  assert.equal(map.size, values.length);
});

test("a map sized for a pool holds it at 10 bytes a slot without growing", () => {
  const n = 100_000;
  const map = new EngineBlockMap(n);
  const before = map.bytes();
  assert.ok(before <= 10 * Math.ceil(n / 0.92 + 2), `${before} bytes`);
  const rnd = lcg(7);
  const keys = new Set<number>();
  while (keys.size < n) keys.add((rnd() * 1048576 + (rnd() >>> 12)) % 2 ** 52);
  let id = 1;
  for (const k of keys) map.insertNew(k, id++);
  assert.equal(map.bytes(), before, "no resize at the size it was made for");
  id = 1;
  for (const k of keys) assert.equal(map.valueAt(map.find(k)), id++);
  // Delete half (backward shift keeps the rest findable), then re-add them.
  let i = 0;
  for (const k of keys) if (i++ % 2 === 0) map.deleteAt(map.find(k));
  assert.equal(map.size, n / 2);
  i = 0;
  for (const k of keys) assert.equal(map.find(k) >= 0, i++ % 2 === 1);
});
