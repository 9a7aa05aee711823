import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Counter, Histogram, Registry } from "prom-client";
import { FastCounterFamily, FastHistogramFamily } from "../../src/util/fast-metrics.ts";

/** Sample lines as a map from `name{sorted labels}` to value, so label order does not matter. */
function samples(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([^{\s]+)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `parsable sample line: ${line}`);
    const labels = (m[2] ?? "").match(/[a-z_]+="(?:[^"\\]|\\.)*"/g) ?? [];
    out.set(`${m[1]}{${labels.sort().join(",")}}`, Number(m[3]));
  }
  return out;
}

describe("fast metric families", () => {
  it("renders the same samples as prom-client's Histogram for the same observations", async () => {
    const buckets = [0.001, 0.01, 0.1, 1];
    const registry = new Registry();
    const ref = new Histogram({
      name: "h_seconds",
      help: "x",
      labelNames: ["model", "endpoint"],
      buckets,
      registers: [registry],
    });
    const fast = new FastHistogramFamily("h_seconds", "x", buckets, ["model", "endpoint"]);
    const values = [0, 0.0005, 0.001, 0.002, 0.05, 0.1, 0.5, 1, 3, 100];
    const labels: [string, string][] = [
      ["m1", "chat"],
      ["m1", "completions"],
      ['we"ird\\name', "chat"],
    ];
    for (const [i, v] of values.entries()) {
      const [model, endpoint] = labels[i % labels.length];
      ref.observe({ model, endpoint }, v);
      fast.child(model, endpoint).observe(v);
    }
    const text = fast.text();
    assert.match(text, /^# HELP h_seconds x\n# TYPE h_seconds histogram\n/);
    assert.deepEqual(samples(text), samples(await registry.metrics()));
    assert.equal(samples(text).get('h_seconds_count{endpoint="chat",model="m1"}'), 4);
  });

  it("FastCounterFamily renders the same samples as prom-client's Counter", async () => {
    const registry = new Registry();
    const ref = new Counter({
      name: "c_total",
      help: "y",
      labelNames: ["model", "status"],
      registers: [registry],
    });
    const fast = new FastCounterFamily("c_total", "y", ["model", "status"]);
    const incs: [string, string, number][] = [
      ["a", "200", 1],
      ["a", "200", 4],
      ["b", "404", 1],
      ["a", "500", 2.5],
    ];
    for (const [model, status, v] of incs) {
      ref.inc({ model, status }, v);
      fast.child(model, status).inc(v);
    }
    const text = fast.text();
    assert.match(text, /^# HELP c_total y\n# TYPE c_total counter\n/);
    assert.deepEqual(samples(text), samples(await registry.metrics()));
    assert.equal(samples(text).get('c_total{model="a",status="200"}'), 5);
  });
});
