/**
 * Prefill-side PD faults end to end through `infera server`: a dead P is replaced by another
 * P; a P slower than the prefill timeout fails the request cleanly (no P left:
 * e2e-fallback.test.ts).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { apiError, ask, clusterFor, promptSources } from "./pd-cluster.ts";

describe("prefill faults", () => {
  test("2P1D: a dead P is skipped; every request is answered by the other P", async (t) => {
    const c = await clusterFor(t, { kind: "nixl", prefills: 2, decodes: 1 });
    await c.prefills[0].sim.stop();
    for (let i = 0; i < 4; i++) {
      const r = await ask(c, `p-dead-${i}`);
      assert.equal(r.usage?.completion_tokens, 5);
    }
    assert.ok((await promptSources(c.prefills[1].sim)).local > 0);
  });

  test("a P slower than prefillTimeoutMs fails the request cleanly (504/502)", async (t) => {
    const c = await clusterFor(t, {
      kind: "nixl",
      prefillArgs: ["--speed", "0.02"],
      serverArgs: ["--policy-option", "prefillTimeoutMs=300"],
    });
    const t0 = Date.now();
    const e = await apiError(ask(c, "slow-p", 5, 60));
    assert.ok(e.status === 502 || e.status === 504, `status ${e.status}`);
    assert.ok(Date.now() - t0 < 20_000, "the 300 ms prefill timeout, not the P finishing");
  });
});
