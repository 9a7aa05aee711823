import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BlockPool } from "../../../src/engine/sim/block-pool.ts";
import { OutputText, OutputVocab } from "../../../src/engine/sim/output.ts";
import { loadProfile, stepSeconds } from "../../../src/engine/sim/profile.ts";
import { Scheduler, type SchedulerObserver } from "../../../src/engine/sim/scheduler.ts";
import { type SeqSink, Sequence } from "../../../src/engine/sim/sequence.ts";
import { Mulberry32 } from "../../../src/util/mulberry32.ts";

const vocab = new OutputVocab([7, 8, 9], [" a", " b", " c"]);
const range = (start: number, n: number): number[] => Array.from({ length: n }, (_, i) => start + i);

const observer: SchedulerObserver & { preempted: number } = {
  preempted: 0,
  onFirstScheduled() {},
  onToken() {},
  onFinished() {},
  onPreempted() {
    this.preempted++;
  },
};

function mkSeq(prompt: number[], maxTokens: number, finished: Sequence[] = [], id = "r"): Sequence {
  const sink: SeqSink = {
    onToken() {},
    onFinish(seq) {
      finished.push(seq);
    },
  };
  return new Sequence({
    requestId: id,
    index: 0,
    promptIds: prompt,
    maxTokens,
    limitReason: "length",
    salt: null,
    output: new OutputText(vocab, new Mulberry32(1), []),
    sink,
    arrivalMs: 0,
  });
}

function run(s: Scheduler, maxSteps = 1000): number {
  let steps = 0;
  for (; steps < maxSteps; steps++) {
    const plan = s.schedule();
    if (!plan) break;
    s.complete(plan);
  }
  return steps;
}

describe("Scheduler", () => {
  it("chunks a long prefill within the token budget, then decodes one token per step", () => {
    const pool = new BlockPool(100, 16);
    const s = new Scheduler(pool, { maxNumSeqs: 8, maxNumBatchedTokens: 64, maxModelLen: 10000 }, observer);
    const done: Sequence[] = [];
    const seq = mkSeq(range(0, 150), 5, done);
    s.add(seq);
    const p1 = s.schedule()!;
    assert.equal(p1.chunks[0].numNew, 64);
    assert.equal(p1.shape.prefillTokens, 64);
    s.complete(p1);
    assert.equal(seq.numOutputTokens, 0, "no token before the prompt is done");
    const p2 = s.schedule()!;
    assert.equal(p2.chunks[0].numNew, 64);
    s.complete(p2);
    const p3 = s.schedule()!;
    assert.equal(p3.chunks[0].numNew, 22);
    s.complete(p3);
    assert.equal(seq.numOutputTokens, 1, "first token at the end of the prefill");
    const p4 = s.schedule()!;
    assert.equal(p4.shape.decodeSeqs, 1);
    assert.equal(p4.shape.decodeKvTokens, 151);
    run(s);
    assert.equal(done.length, 1);
    assert.equal(seq.numOutputTokens, 5);
    assert.equal(seq.finishReason, "length");
    assert.equal(pool.numUsed, 0);
  });

  it("batches: admits waiting sequences up to max-num-seqs and the budget", () => {
    const pool = new BlockPool(100, 16);
    const s = new Scheduler(pool, { maxNumSeqs: 2, maxNumBatchedTokens: 1000, maxModelLen: 10000 }, observer);
    for (let i = 0; i < 3; i++) s.add(mkSeq(range(i * 1000, 20), 3));
    const plan = s.schedule()!;
    assert.equal(plan.chunks.length, 2);
    assert.equal(s.waiting.length, 1);
    s.complete(plan);
    const plan2 = s.schedule()!;
    assert.equal(plan2.shape.decodeSeqs, 2);
    assert.equal(plan2.chunks.length, 2, "third waits for a free slot");
    run(s);
    assert.equal(s.hasWork, false);
  });

  it("uses prefix-cache hits and always recomputes at least one token", () => {
    const pool = new BlockPool(100, 16);
    const s = new Scheduler(pool, { maxNumSeqs: 8, maxNumBatchedTokens: 1000, maxModelLen: 10000 }, observer);
    s.add(mkSeq(range(0, 48), 1));
    run(s);
    const again = mkSeq(range(0, 48), 1);
    s.add(again);
    const plan = s.schedule()!;
    assert.equal(again.numCachedPromptTokens, 32, "3 full blocks cached but the last must be recomputed");
    assert.equal(plan.chunks[0].numNew, 16);
    run(s);
    const longer = mkSeq([...range(0, 48), 99, 98], 1);
    s.add(longer);
    s.schedule();
    assert.equal(longer.numCachedPromptTokens, 48);
  });

  it("preempts the newest running sequence when blocks run out, and still finishes everything", () => {
    observer.preempted = 0;
    const pool = new BlockPool(6, 4);
    const s = new Scheduler(pool, { maxNumSeqs: 8, maxNumBatchedTokens: 100, maxModelLen: 1000 }, observer);
    const done: Sequence[] = [];
    const a = mkSeq(range(0, 8), 8, done, "a");
    const b = mkSeq(range(100, 8), 8, done, "b");
    s.add(a);
    s.add(b);
    run(s);
    assert.ok(observer.preempted > 0, "pool of 6x4 cannot hold two 16-token sequences");
    assert.ok(b.numPreemptions > 0, "the later one is the victim");
    assert.equal(a.numPreemptions, 0);
    assert.equal(done.length, 2);
    assert.equal(a.numOutputTokens, 8);
    assert.equal(b.numOutputTokens, 8);
    assert.equal(pool.numUsed, 0);
  });

  it("abort frees a running sequence's blocks at once", () => {
    const pool = new BlockPool(50, 16);
    const s = new Scheduler(pool, { maxNumSeqs: 8, maxNumBatchedTokens: 1000, maxModelLen: 10000 }, observer);
    const seq = mkSeq(range(0, 100), 100);
    s.add(seq);
    s.complete(s.schedule()!);
    assert.ok(pool.numUsed > 0);
    s.abort(seq);
    assert.equal(pool.numUsed, 0);
    assert.equal(s.running.length, 0);
    assert.equal(seq.finishReason, "abort");
  });

  it("a sequence larger than the pool finishes with length instead of looping", () => {
    const pool = new BlockPool(2, 4);
    const s = new Scheduler(pool, { maxNumSeqs: 8, maxNumBatchedTokens: 100, maxModelLen: 1000 }, observer);
    const seq = mkSeq(range(0, 6), 50);
    s.add(seq);
    const steps = run(s, 200);
    assert.ok(steps < 200);
    assert.equal(seq.finishReason, "length");
    assert.equal(pool.numUsed, 0);
  });
});

describe("timing profile", () => {
  it("the default profile gives plausible MI355X figures", () => {
    const p = loadProfile();
    const decode64 = stepSeconds(p, {
      prefillTokens: 0,
      prefillTokenCtx: 0,
      decodeSeqs: 64,
      decodeKvTokens: 64 * 1024,
    });
    assert.ok(decode64 > 0.004 && decode64 < 0.01, `64x1k decode step ${decode64}`);
    const prefill4k = stepSeconds(p, {
      prefillTokens: 4096,
      prefillTokenCtx: 4096 * 4096,
      decodeSeqs: 0,
      decodeKvTokens: 0,
    });
    assert.ok(prefill4k > 0.05 && prefill4k < 0.15, `4k prefill ${prefill4k}`);
  });
});
