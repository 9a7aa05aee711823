/**
 * No prefill worker left, end to end through `infera server`: the request fails cleanly, or
 * runs on D as an ordinary (mixed) request with `--policy-option pdFallbackMixed=true`.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { apiError, ask, clusterFor, promptSources } from "./pd-cluster.ts";

describe("no prefill worker left", () => {
  test("1P1D, P dead: a clean OpenAI error; with pdFallbackMixed the request runs on D", async (t) => {
    const strict = await clusterFor(t, { kind: "mooncake" });
    await strict.prefills[0].sim.stop();
    const e = await apiError(ask(strict, "no-p"));
    assert.ok(e.status === 502 || e.status === 503, `status ${e.status}`);
    assert.equal(typeof e.message, "string");

    const lenient = await clusterFor(t, {
      kind: "mooncake",
      serverArgs: ["--policy-option", "pdFallbackMixed=true"],
    });
    await lenient.prefills[0].sim.stop();
    const r = await ask(lenient, "fallback");
    assert.equal(r.usage?.completion_tokens, 5);
    const src = await promptSources(lenient.decodes[0].sim);
    assert.equal(src.external, 0, "nothing was pulled");
    assert.equal(src.local, r.usage?.prompt_tokens, "D computed the whole prompt as a mixed worker");
  });
});
