/**
 * P chosen by the server's kv-aware policy (fed by the prefill sims' KV events), end to end:
 * follow-ups on a document go to the prefill worker that already holds it, and hit its cache.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { clusterFor, MODEL, promptSources } from "./pd-cluster.ts";

const doc = `Shared document. ${"Prefill workers keep the KV of documents they have read; routing follow-ups to them skips the prefill. ".repeat(20)}`;

describe("2P1D nixl with --policy kv-aware", () => {
  test("follow-ups on a document land on the P that cached it", async (t) => {
    const c = await clusterFor(t, {
      kind: "nixl",
      prefills: 2,
      decodes: 1,
      serverArgs: ["--policy", "kv-aware"],
    });
    const askDoc = (q: string) =>
      c.client.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: `${doc}\nQuestion: ${q}` }],
        max_tokens: 3,
      });
    await askDoc("what is this about?");
    // Let the BlockStored events reach the server's index (the policy also remembers its own routing).
    await new Promise((r) => setTimeout(r, 500));
    const before = await Promise.all(c.prefills.map((p) => promptSources(p.sim)));
    const holder = before.findIndex((s) => s.local > 0);
    assert.ok(holder >= 0, "one P computed the document");
    for (const q of ["who reads it?", "why route there?", "how long is it?"]) {
      const r = await askDoc(q);
      assert.equal(r.usage?.completion_tokens, 3);
    }
    const after = await Promise.all(c.prefills.map((p) => promptSources(p.sim)));
    const other = 1 - holder;
    assert.ok(
      after[holder].hit - before[holder].hit >= 3 * 200,
      `holder cache hits ${after[holder].hit - before[holder].hit}`,
    );
    assert.equal(
      after[other].local + after[other].hit,
      before[other].local + before[other].hit,
      "the other P got none",
    );
  });
});
