/**
 * Decode-side PD faults end to end through `infera server`: D failing after P is a clean 502
 * and P frees its blocks; a D slower than the decode timeout is a 504; a client abort
 * cancels both halves.
 */
import assert from "node:assert/strict";
import { describe, type TestContext, test } from "node:test";
import { APIError } from "openai";
import { longPrompt, MODEL, metric, type PdCluster, startPdCluster, waitFor } from "./pd-cluster.ts";

/** A cluster that lives for one test (stopped in its `after`, so the machine is not crowded). */
async function cluster(t: TestContext, o: Parameters<typeof startPdCluster>[0]): Promise<PdCluster> {
  const c = await startPdCluster(o);
  t.after(() => c.close());
  return c;
}

const ask = (c: PdCluster, tag: string, maxTokens = 5, repeat = 10) =>
  c.client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: longPrompt(tag, repeat) }],
    max_tokens: maxTokens,
  });

async function apiError(p: Promise<unknown>): Promise<APIError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof APIError, String(err));
    return err;
  }
  assert.fail("expected an error answer");
}

describe("decode faults", () => {
  test("D dead after P: clean 502, and P frees the blocks it held", async (t) => {
    const c = await cluster(t, { kind: "nixl", prefillArgs: ["--kv-hold-timeout-ms", "500"] });
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
    const c = await cluster(t, { kind: "moriio" });
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
    const c = await cluster(t, {
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

describe("client abort", () => {
  for (const kind of ["nixl", "sglang"] as const) {
    test(`${kind}: breaking off a stream cancels the request on D and P ends with nothing held`, async (t) => {
      const c = await cluster(t, { kind, decodeArgs: ["--speed", "1"] });
      const stream = await c.client.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: longPrompt(`abort-${kind}`) }],
        max_tokens: 3000,
        stream: true,
      });
      let chunks = 0;
      for await (const _ of stream) if (++chunks >= 3) break;
      assert.equal(await metric(c.decodes[0].sim, "vllm:num_requests_running"), 1);
      await waitFor(
        async () => (await metric(c.decodes[0].sim, "vllm:num_requests_running")) === 0,
        4000,
        "D to abort",
      );
      assert.equal(await metric(c.decodes[0].sim, "vllm:kv_cache_usage_perc"), 0);
      await waitFor(
        async () => (await metric(c.prefills[0].sim, "vllm:kv_cache_usage_perc")) === 0,
        4000,
        "P to be empty",
      );
      assert.equal(await metric(c.prefills[0].sim, "vllm:num_requests_running"), 0);
    });
  }
});
