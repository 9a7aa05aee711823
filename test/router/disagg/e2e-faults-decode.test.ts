/**
 * Decode-side PD faults end to end through `infera server`: D failing after P is a clean 502
 * and P frees its blocks; a D slower than the decode timeout is a 504 (client aborts:
 * e2e-abort.test.ts).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { apiError, ask, clusterFor, metric, waitFor } from "./pd-cluster.ts";

describe("decode faults", () => {
  test("D dead after P: clean 502, and P frees the blocks it held", async (t) => {
    const c = await clusterFor(t, { kind: "nixl", prefillArgs: ["--kv-hold-timeout-ms", "500"] });
    await c.decodes[0].sim.stop();
    const e = await apiError(ask(c, "d-dead"));
    assert.equal(e.status, 502);
    assert.match(e.message, /Decode worker/);
    await waitFor(
      async () => (await metric(c.prefills[0].sim, "vllm:kv_cache_usage_perc")) === 0,
      4000,
      "P to free its blocks",
    );
  });

  test("moriio, D dead after P: the router notifies P, which frees its blocks at once", async (t) => {
    // P's own hold timeout stays at the 120 s default, so only the notify can free them quickly.
    const c = await clusterFor(t, { kind: "moriio" });
    await c.decodes[0].sim.stop();
    const e = await apiError(ask(c, "d-dead-moriio"));
    assert.equal(e.status, 502);
    await waitFor(
      async () => (await metric(c.prefills[0].sim, "vllm:kv_cache_usage_perc")) === 0,
      5000,
      "P to free its blocks",
    );
  });

  test("a D slower than decodeTimeoutMs: 504", async (t) => {
    const c = await clusterFor(t, {
      kind: "atom",
      decodeArgs: ["--speed", "1"],
      serverArgs: ["--policy-option", "decodeTimeoutMs=800"],
    });
    const e = await apiError(ask(c, "slow-d", 1000));
    assert.equal(e.status, 504);
    await waitFor(
      async () => (await metric(c.decodes[0].sim, "vllm:num_requests_running")) === 0,
      4000,
      "D to drop it",
    );
  });
});
