/**
 * candidateView: a candidate list's ids and positions, kept per list (the WorkerSet's stable
 * lists by identity) and rebuilt when a list not marked stable changed in place.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { candidateView } from "../../../src/router/pipeline/util.ts";
import { isStable, markStable } from "../../../src/util/stable-lists.ts";
import { makeWorker } from "./recorder.ts";

test("candidateView: ids and positions per list, kept while the list is the same", () => {
  const list = ["a", "b", "c"].map((id) => makeWorker({ id }));
  const v = candidateView(list);
  assert.deepEqual(v.ids, ["a", "b", "c"]);
  assert.equal(v.pos.get("c"), 2);
  assert.ok(isStable(v.ids), "stable ids: the KV index may know them by identity");
  assert.equal(candidateView(list), v, "the same list: the same view");
  // A list not marked stable may change in place: seen, and rebuilt.
  list[1] = makeWorker({ id: "x" });
  const w = candidateView(list);
  assert.notEqual(w, v);
  assert.deepEqual(w.ids, ["a", "x", "c"]);
  assert.equal(w.pos.get("x"), 1);
  assert.equal(w.pos.get("b"), undefined);
  list.push(makeWorker({ id: "d" }));
  assert.deepEqual(candidateView(list).ids, ["a", "x", "c", "d"]);
  // A stable list never changes: its view is taken by identity, unchecked.
  const stable = markStable(["p", "q"].map((id) => makeWorker({ id })));
  const s = candidateView(stable);
  assert.deepEqual(s.ids, ["p", "q"]);
  assert.equal(candidateView(stable), s);
});
