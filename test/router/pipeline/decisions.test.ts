/**
 * The decision ring's per-candidate overlap: copied out of the step's overlaps into arrays the
 * slot owns (a source reusing its buffer later cannot rewrite history), grown when a step has
 * more candidates than the slot held, and null again for a step without an overlap source.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import { DecisionLog } from "../../../src/router/pipeline/decisions.ts";
import type { StepContext } from "../../../src/router/pipeline/types.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { createLogger } from "../../../src/util/log.ts";
import { makeWorker } from "./recorder.ts";

const workers = (n: number) =>
  Array.from({ length: n }, (_, i) => ({ record: { id: `w${i}` } }) as unknown as WorkerState);

/** Only what the ring reads from a step: its overlaps, prompt blocks and bridged blocks. */
function ctxOf(
  overlaps: Int32Array,
  promptBlocks: (pos: number) => number,
  bridged: Int32Array | null = null,
): StepContext {
  // The ring reads the prompt blocks as a whole row, one per candidate of `overlaps`.
  const promptBlocksRow = () => Int32Array.from(overlaps, (_, i) => promptBlocks(i));
  return { overlaps: () => overlaps, promptBlocksRow, bridged: () => bridged } as unknown as StepContext;
}

test("records each candidate's cached and prompt blocks, copied, grown, and null without a source", () => {
  const log = new DecisionLog(1);
  const all2 = workers(2);
  const shared = new Int32Array([3, 0]);
  log.record(
    "r1",
    "m",
    "mixed",
    all2,
    [0, 1],
    [],
    null,
    new Float64Array(2),
    0,
    "overlap",
    ctxOf(shared, () => 8),
  );
  shared[0] = 99; // a source reusing its buffer for the next step
  let [d] = log.list();
  assert.deepEqual(
    d!.candidates.map((c) => [c.worker, c.cachedBlocks, c.promptBlocks]),
    [
      ["w0", 3, 8],
      ["w1", 0, 8],
    ],
  );

  // More candidates than the slot held (its arrays start at 16): every one recorded.
  const all40 = workers(40);
  const big = Int32Array.from({ length: 40 }, (_, i) => i % 5);
  // Filtered candidates (not kept) still show their overlap: it was counted for all of `all`.
  const kept = [1, 2, 39];
  log.record(
    "r2",
    "m",
    "mixed",
    all40,
    kept,
    [],
    null,
    new Float64Array(3),
    39,
    "overlap",
    ctxOf(big, (i) => 10 + i),
  );
  [d] = log.list();
  assert.equal(d!.candidates.length, 40);
  d!.candidates.forEach((c, i) => {
    assert.equal(c.cachedBlocks, i % 5, c.worker);
    assert.equal(c.promptBlocks, 10 + i, c.worker);
    assert.equal(c.filtered === true, !kept.includes(i));
  });

  // The same slot, a step without an overlap source (round-robin): null, not stale numbers.
  log.record("r3", "m", "mixed", all2, [0, 1], [], null, new Float64Array(2), 1, "round-robin");
  [d] = log.list();
  assert.deepEqual(
    d!.candidates.map((c) => [c.cachedBlocks, c.promptBlocks]),
    [
      [null, null],
      [null, null],
    ],
  );
});

test("records each candidate's pending-bridge blocks (bridgeBlocks), null without a bridge", () => {
  const log = new DecisionLog(1);
  const all = workers(3);
  const bridged = new Int32Array([0, 5, 0]);
  const rec = (b: Int32Array | null) =>
    log.record(
      "r",
      "m",
      "mixed",
      all,
      [0, 1, 2],
      [],
      null,
      new Float64Array(3),
      1,
      "overlap",
      ctxOf(new Int32Array([2, 7, 0]), () => 9, b),
    );
  rec(bridged);
  bridged[1] = 0; // a source reusing its buffer: the ring keeps its own copy
  let [d] = log.list();
  assert.deepEqual(
    d!.candidates.map((c) => [c.worker, c.cachedBlocks, c.bridgeBlocks]),
    [
      ["w0", 2, 0],
      ["w1", 7, 5],
      ["w2", 0, 0],
    ],
  );
  const json = JSON.parse(JSON.stringify(d)) as { candidates: Array<{ bridgeBlocks: number | null }> };
  assert.equal(json.candidates[1]!.bridgeBlocks, 5, "in the JSON /debug/decisions serves");
  rec(null);
  [d] = log.list();
  assert.deepEqual(
    d!.candidates.map((c) => c.bridgeBlocks),
    [null, null, null],
  );
});

test("records the scores and totals as they were: the step may reuse its rows for the next decision", () => {
  const log = new DecisionLog(4);
  const all = workers(3);
  // One pair of rows, rewritten between decisions, as the scheduler's step does.
  const values = new Float64Array(6);
  const totals = new Float64Array(3);
  const decide = (id: string, v: number[], winner: number) => {
    values.set(v);
    for (let k = 0; k < 3; k++) totals[k] = v[k] + v[3 + k];
    log.record(id, "m", "mixed", all, [0, 1, 2], ["x", "y"], values, totals, winner, "score");
  };
  decide("r1", [1, 2, 3, 10, 20, 30], 0);
  decide("r2", [7, 8, 9, 0, 0, 0], 2);
  values.fill(-1);
  totals.fill(-1);
  const [d1, d2] = log.list();
  assert.deepEqual(
    d1!.candidates.map((c) => [c.scores, c.total]),
    [
      [{ x: 1, y: 10 }, 11],
      [{ x: 2, y: 20 }, 22],
      [{ x: 3, y: 30 }, 33],
    ],
  );
  assert.deepEqual(
    d2!.candidates.map((c) => c.total),
    [7, 8, 9],
  );
});

test("a step's decisions record their own scores (the scheduler reuses its rows)", () => {
  const logger = createLogger("test");
  logger.level = "silent";
  const decisions = new DecisionLog(8);
  const sched = buildScheduling({ policy: "kv-aware" }).create({ model: "m", logger, decisions });
  const ws = ["a", "b"].map((id) => makeWorker({ id, kv: false }));
  const req = (id: string) => ({
    requestId: id,
    model: "m",
    endpoint: "completion" as const,
    body: {},
    stream: false,
    promptText: () => "hello",
    promptTokens: () => [1, 2, 3],
  });
  ws[0].inFlight = 4;
  sched.select(req("q1"), ws);
  ws[0].inFlight = 0;
  ws[1].inFlight = 6;
  sched.select(req("q2"), ws);
  const [d1, d2] = decisions.list();
  const decode = (d: typeof d1) => d!.candidates.map((c) => c.scores["active-decode"]);
  assert.deepEqual(decode(d1), [2, 0], "q1's own active-decode row");
  assert.deepEqual(decode(d2), [0, 3]);
  assert.deepEqual([d1!.winner, d2!.winner], ["b", "a"]);
});
