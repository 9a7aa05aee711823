/**
 * The approximate prefix tree's bounds (issue #17 item 1): routing one huge prompt must cost a
 * bounded amount of event-loop time, so the tree walks only the text's head (`maxChars`).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { APPROX_TEXT_CAP, ApproxPrefixTree } from "../../src/kv/approx-tree.ts";
import { hashString } from "../../src/kv/hash.ts";

test("only the first maxChars characters are walked (default 32 Ki)", () => {
  assert.equal(APPROX_TEXT_CAP, 32 * 1024);
  const t = new ApproxPrefixTree();
  assert.equal(t.path("x".repeat(1_000_000)).length, APPROX_TEXT_CAP / t.chunkChars);
  const shared = "s".repeat(40_000);
  t.insert(`${shared}AAAA`, "w");
  // Both texts agree on their first 40 000 characters; the tree looks at 32 768 of them.
  assert.deepEqual([...t.match(`${shared}BBBB`, ["w"])], [APPROX_TEXT_CAP]);
  assert.equal(t.size("w"), APPROX_TEXT_CAP / t.chunkChars);
  // Under the cap nothing changes: the match ends where the texts' chunks differ.
  const small = new ApproxPrefixTree({ maxChars: 100 });
  small.insert("a".repeat(64) + "b".repeat(64), "w");
  assert.deepEqual([...small.match("a".repeat(64) + "c".repeat(64), ["w"])], [64]);
  assert.deepEqual([...small.match("a".repeat(64) + "b".repeat(64), ["w"])], [100]);
});

test("node keys are the chained hashString of each chunk (hashed in place)", () => {
  let text = "";
  for (let i = 0; i < 300; i++) text += String.fromCharCode(32 + ((i * 7919) % 30_000));
  const t = new ApproxPrefixTree({ chunkChars: 7 });
  let a = 0x1b873593;
  let b = 0x2f0e1eba;
  const want: number[] = [];
  for (let i = 0; i < text.length; i += 7) {
    const chunk = text.slice(i, i + 7);
    a = hashString(chunk, a);
    b = hashString(chunk, b ^ 0x7fb5d329);
    want.push(a * 1048576 + (b >>> 12));
  }
  assert.deepEqual(t.path(text), want);
});

test("a worker's nodes expire and are dropped with the worker", () => {
  let now = 0;
  const t = new ApproxPrefixTree({ chunkChars: 4, maxAgeMs: 10, now: () => now });
  t.insert("aaaabbbb", "w");
  t.insert("aaaa", "v");
  assert.deepEqual([...t.match("aaaabbbb", ["w", "v", "x"])], [8, 4, 0]);
  now = 11;
  assert.deepEqual([...t.match("aaaabbbb", ["w", "v"])], [0, 0]);
  t.insert("aaaa", "w");
  assert.deepEqual([...t.match("aaaabbbb", ["w"])], [4]);
  t.removeWorker("w");
  assert.equal(t.size("w"), 0);
  assert.deepEqual([...t.match("aaaabbbb", ["w"])], [0]);
});
