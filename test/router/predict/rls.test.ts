/**
 * The TTFT predictor's online fit alone (src/router/predict): it learns a worker's line from a
 * handful of samples with no calibration, and re-fits when the worker's speed changes.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { FEATURES, TtftPredictor } from "../../../src/router/predict/ttft.ts";

/** A worker whose TTFT is `fixed + perK × (uncached + backlog)/1000 + perWaiting × waiting` ms, ±5 %. */
function sample(rand: () => number, speed: number): { x: Float64Array; y: number } {
  const x = new Float64Array(FEATURES);
  x[0] = 1;
  // Uncached prompt plus backlog, k tokens.
  x[1] = 0.2 + rand() * 4 + (rand() < 0.5 ? 0 : rand() * 6);
  x[2] = Math.floor(rand() * 4) / 8;
  x[3] = Math.floor(rand() * 16) / 32;
  const y = (3 + 16 * x[1] + 20 * x[2] * 8 + 0.5 * x[3] * 32) / speed;
  return { x, y: y * (0.95 + rand() * 0.1) };
}

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function medianRelError(p: TtftPredictor, rand: () => number, speed: number, n = 50): number {
  const errs: number[] = [];
  for (let i = 0; i < n; i++) {
    const { x, y } = sample(rand, speed);
    errs.push(Math.abs(p.predictFeatures("m", "w", x) - y) / y);
  }
  errs.sort((a, b) => a - b);
  return errs[Math.floor(n / 2)]!;
}

test("no prediction before any sample; a new worker starts from the model's pooled fit", () => {
  const p = new TtftPredictor();
  const x = new Float64Array([1, 1, 0, 0]);
  assert.ok(Number.isNaN(p.predictFeatures("m", "w", x)));
  const rand = lcg(1);
  for (let i = 0; i < 30; i++) {
    const s = sample(rand, 1);
    p.observe("m", "w", s.x, s.y);
  }
  const own = p.predictFeatures("m", "w", x);
  const fresh = p.predictFeatures("m", "other", x);
  assert.ok(Math.abs(fresh - own) / own < 0.2, `pooled ${fresh} vs own ${own}`);
  assert.ok(Number.isNaN(p.predictFeatures("other-model", "x", x)), "another model knows nothing");
});

test("fits a worker's line from a few samples and re-fits after it slows down 4×", () => {
  const p = new TtftPredictor();
  const rand = lcg(7);
  for (let i = 0; i < 25; i++) {
    const s = sample(rand, 1);
    p.observe("m", "w", s.x, s.y);
  }
  const before = medianRelError(p, lcg(99), 1);
  assert.ok(before < 0.1, `median relative error ${before} after 25 samples`);
  // The worker becomes 4× slower (another GPU, another quantization): old predictions are 75 % low.
  assert.ok(medianRelError(p, lcg(99), 0.25) > 0.6);
  for (let i = 0; i < 40; i++) {
    const s = sample(rand, 0.25);
    p.observe("m", "w", s.x, s.y);
  }
  const after = medianRelError(p, lcg(98), 0.25);
  assert.ok(after < 0.15, `median relative error ${after} 40 samples after the slowdown`);
});

test("an outlier (a preempted request) moves the fit by a bounded amount", () => {
  const p = new TtftPredictor();
  const rand = lcg(3);
  for (let i = 0; i < 40; i++) {
    const s = sample(rand, 1);
    p.observe("m", "w", s.x, s.y);
  }
  const x = new Float64Array([1, 2, 0, 0]);
  const was = p.predictFeatures("m", "w", x);
  p.observe("m", "w", x, was * 50);
  const now = p.predictFeatures("m", "w", x);
  assert.ok(now < was * 4, `one 50× sample moved the prediction from ${was} to ${now}`);
});
