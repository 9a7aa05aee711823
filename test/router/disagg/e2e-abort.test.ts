/**
 * A client that breaks off a stream cancels both halves end to end through `infera server`:
 * D stops decoding and frees its blocks, P ends with nothing held.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { clusterFor, longPrompt, MODEL, metric, waitFor } from "./pd-cluster.ts";

describe("client abort", () => {
  for (const kind of ["nixl", "sglang"] as const) {
    test(`${kind}: breaking off a stream cancels the request on D and P ends with nothing held`, async (t) => {
      const c = await clusterFor(t, { kind, decodeArgs: ["--speed", "1"] });
      const stream = await c.client.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: longPrompt(`abort-${kind}`) }],
        max_tokens: 3000,
        stream: true,
      });
      // D's running count is read while the stream is still open: once the loop breaks, the
      // client's abort races the read, and on a loaded machine D may already have dropped it.
      let chunks = 0;
      let runningBeforeAbort = -1;
      for await (const _ of stream) {
        if (++chunks < 3) continue;
        runningBeforeAbort = await metric(c.decodes[0].sim, "vllm:num_requests_running");
        break;
      }
      assert.equal(runningBeforeAbort, 1);
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
