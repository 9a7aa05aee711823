/**
 * Prefill-side PD faults end to end through `infera server`: a dead P is replaced by another
 * P; with no P left the request fails cleanly, or runs on D as mixed with pdFallbackMixed; a
 * P slower than the prefill timeout fails cleanly.
 */
import assert from "node:assert/strict";
import { describe, type TestContext, test } from "node:test";
import { APIError } from "openai";
import { longPrompt, MODEL, type PdCluster, promptSources, startPdCluster } from "./pd-cluster.ts";

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

describe("prefill faults", () => {
  test("2P1D: a dead P is skipped; every request is answered by the other P", async (t) => {
    const c = await cluster(t, { kind: "nixl", prefills: 2, decodes: 1 });
    await c.prefills[0].sim.stop();
    for (let i = 0; i < 4; i++) {
      const r = await ask(c, `p-dead-${i}`);
      assert.equal(r.usage?.completion_tokens, 5);
    }
    assert.ok((await promptSources(c.prefills[1].sim)).local > 0);
  });

  test("1P1D, P dead: a clean OpenAI error; with pdFallbackMixed the request runs on D", async (t) => {
    const strict = await cluster(t, { kind: "mooncake" });
    await strict.prefills[0].sim.stop();
    const e = await apiError(ask(strict, "no-p"));
    assert.ok(e.status === 502 || e.status === 503, `status ${e.status}`);
    assert.equal(typeof e.message, "string");

    const lenient = await cluster(t, {
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

  test("a P slower than prefillTimeoutMs fails the request cleanly (504/502)", async (t) => {
    const c = await cluster(t, {
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
