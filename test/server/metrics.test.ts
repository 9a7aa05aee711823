/**
 * The server's hot counters keep the label children they used last (src/server/metrics.ts):
 * a request with other labels than the one before must still land in its own series. The
 * exposition is read back and every series counted, with labels alternating request by
 * request, as concurrent requests of several models, endpoints and statuses interleave.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { WorkerSet } from "../../src/router/worker-set.ts";
import { ServerMetrics } from "../../src/server/metrics.ts";
import { createLogger } from "../../src/util/log.ts";

const logger = createLogger("test", {});
logger.level = "silent";

const sample = (text: string, series: string): number => {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? Number.NaN : Number(line.slice(series.length + 1));
};

describe("ServerMetrics label children", () => {
  it("counts every request, e2e observation and decision in its own series when labels alternate", async () => {
    const m = new ServerMetrics(new WorkerSet(new MemoryDiscovery([]), { logger }));
    const calls: [model: string, endpoint: string, status: number][] = [
      ["a", "chat", 200],
      ["a", "chat", 200],
      ["b", "chat", 200],
      ["a", "completions", 200],
      ["a", "chat", 502],
      ["a", "chat", 200],
      ["b", "chat", 200],
    ];
    for (const [model, endpoint, status] of calls) {
      m.countRequest(model, endpoint, status);
      m.observeE2e(model, endpoint, 0.002);
    }
    const reasons = ["round-robin", "round-robin", "overlap", "round-robin", "load"];
    for (const reason of reasons)
      m.onDecision("a", reason === "round-robin" ? "round-robin" : "kv-aware", "mixed", {
        worker: undefined as never,
        reason,
        seconds: 0.00001,
      });
    const text = await m.text();
    const req = (model: string, endpoint: string, status: number) =>
      sample(text, `infera_requests_total{model="${model}",endpoint="${endpoint}",status="${status}"}`);
    assert.equal(req("a", "chat", 200), 3);
    assert.equal(req("b", "chat", 200), 2);
    assert.equal(req("a", "completions", 200), 1);
    assert.equal(req("a", "chat", 502), 1);
    const e2e = (model: string, endpoint: string) =>
      sample(text, `infera_e2e_request_latency_seconds_count{model="${model}",endpoint="${endpoint}"}`);
    assert.equal(e2e("a", "chat"), 4);
    assert.equal(e2e("b", "chat"), 2);
    assert.equal(e2e("a", "completions"), 1);
    const dec = (policy: string, reason: string) =>
      sample(text, `infera_routing_decisions_total{policy="${policy}",reason="${reason}",router="mixed"}`);
    assert.equal(dec("round-robin", "round-robin"), 3);
    assert.equal(dec("kv-aware", "overlap"), 1);
    assert.equal(dec("kv-aware", "load"), 1);
  });
});
