/** RowArena (src/router/pipeline/rows.ts): the per-decision scratch rows the scheduler's steps reuse. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { RowArena } from "../../../src/router/pipeline/rows.ts";

test("rows are zeroed, disjoint and 8-aligned, also after a reset reuses dirty memory", () => {
  const a = new RowArena(256);
  const x = a.i32(3);
  const y = a.f64(2);
  const z = a.u8(5);
  x.fill(-1);
  y.fill(7.5);
  z.fill(9);
  // Disjoint: writing one row left the others as written.
  assert.deepEqual(Array.from(x), [-1, -1, -1]);
  assert.deepEqual(Array.from(y), [7.5, 7.5]);
  assert.deepEqual(Array.from(z), [9, 9, 9, 9, 9]);
  for (const r of [x, y, z]) assert.equal(r.byteOffset % 8, 0);
  a.reset();
  const x2 = a.i32(3);
  const y2 = a.f64(2);
  const z2 = a.u8(5);
  // Same memory as before the reset, handed out zeroed.
  assert.equal(x2.buffer, x.buffer);
  assert.deepEqual(Array.from(x2), [0, 0, 0]);
  assert.deepEqual(Array.from(y2), [0, 0]);
  assert.deepEqual(Array.from(z2), [0, 0, 0, 0, 0]);
});

test("a full arena grows into a new buffer and the rows taken before keep their values", () => {
  const a = new RowArena(64);
  const first = a.i32(12); // 48 of 64 bytes
  first.fill(4);
  const big = a.f64(100); // does not fit: a new buffer
  assert.notEqual(big.buffer, first.buffer);
  assert.equal(big.length, 100);
  big.fill(1);
  assert.deepEqual(Array.from(first), new Array(12).fill(4));
  // The larger buffer serves the next decision without growing again.
  a.reset();
  assert.equal(a.f64(100).buffer, big.buffer);
});
