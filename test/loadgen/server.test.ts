import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { compareResults } from "../../src/loadgen/compare.ts";
import { runBench } from "../../src/loadgen/runner.ts";
import { type Cluster, startCluster } from "../server/cluster.ts";

describe("infera bench through infera server (2 sims)", () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await startCluster(2, { simArgs: ["--speed", "20", "--seed", "1"] });
  });
  after(async () => {
    await cluster?.close();
  });

  it("streams through the router: counts add up, usage and cached tokens arrive", async () => {
    const common = {
      url: cluster.server.url,
      model: cluster.sims[0].model,
      workload: { kind: "doc-qa" as const, documents: 2, docLen: 400 },
      requests: 16,
      concurrency: 4,
      maxTokens: 6,
      seed: 5,
    };
    const streamed = await runBench({ ...common, label: "streamed" });
    const whole = await runBench({ ...common, stream: false, label: "not streamed" });
    for (const r of [streamed, whole]) {
      const s = r.summary.requests;
      assert.equal(s.ok, 16, JSON.stringify(r.summary.errors_by_kind));
      assert.equal(s.ok + s.errors + s.not_sent, s.requested);
      assert.equal(r.summary.tokens.usage_missing, 0);
      assert.ok((r.summary.prefix_cache_hit_rate ?? 0) > 0.3, `hit rate ${r.summary.prefix_cache_hit_rate}`);
    }
    // Tokens a slow reader has not taken yet may arrive merged in one event (as with vLLM),
    // so a stream has at least one content chunk and one gap fewer than chunks.
    assert.ok(
      streamed.requests.every(
        (x) => x.chunks >= 1 && x.itl_ms.length === x.chunks - 1 && (x.ttft_ms ?? 0) <= (x.e2e_ms ?? 0),
      ),
    );
    assert.ok(whole.requests.every((x) => x.ttft_ms === x.e2e_ms));
    const ratio = compareResults(streamed, whole).find((r) => r.metric === "ok requests")?.ratio;
    assert.equal(ratio, 1);
  });
});
