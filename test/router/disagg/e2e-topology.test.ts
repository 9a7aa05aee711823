/**
 * xPyD topologies end to end through `infera server`: 2P1D (serial, nixl), 1P2D
 * (concurrent, mooncake), 2P2D (concurrent, sglang). Every P and every D takes part, and
 * every D pulled what its Ps computed instead of recomputing it.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  longPrompt,
  MODEL,
  metric,
  type PdCluster,
  type PdKind,
  promptSources,
  startPdCluster,
} from "./pd-cluster.ts";

const topologies: Array<{ kind: PdKind; p: number; d: number; maxTokens: number }> = [
  { kind: "nixl", p: 2, d: 1, maxTokens: 4 },
  { kind: "mooncake", p: 1, d: 2, maxTokens: 40 },
  { kind: "sglang", p: 2, d: 2, maxTokens: 40 },
];

for (const t of topologies) {
  describe(`e2e ${t.p}P${t.d}D ${t.kind}`, () => {
    let c: PdCluster;
    before(async () => {
      c = await startPdCluster({ kind: t.kind, prefills: t.p, decodes: t.d });
    });
    after(async () => {
      await c?.close();
    });

    test("concurrent requests use every worker; D pulls instead of recomputing", async (tc) => {
      tc.after(() => {
        if (failed) console.error(c.dump());
      });
      let failed = true;
      const n = 8;
      const results = await Promise.all(
        Array.from({ length: n }, async (_, i) => {
          const stream = await c.client.chat.completions.create({
            model: MODEL,
            messages: [{ role: "user", content: longPrompt(`${t.kind}-${t.p}${t.d}-${i}`) }],
            max_tokens: t.maxTokens,
            stream: true,
            stream_options: { include_usage: true },
          });
          let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
          for await (const ch of stream) if (ch.usage) usage = ch.usage;
          return usage;
        }),
      );
      let promptTotal = 0;
      for (const u of results) {
        assert.equal(u?.completion_tokens, t.maxTokens);
        promptTotal += u?.prompt_tokens ?? 0;
      }
      for (const p of c.prefills) {
        const src = await promptSources(p.sim);
        assert.ok(src.local > 0, `prefill ${p.record.id} computed prompts`);
      }
      let external = 0;
      let local = 0;
      for (const d of c.decodes) {
        const gen = await metric(d.sim, "vllm:generation_tokens_total");
        assert.ok(gen > 0, `decode ${d.record.id} generated tokens`);
        const src = await promptSources(d.sim);
        external += src.external;
        local += src.local;
      }
      assert.ok(external >= promptTotal - n * 16, `D pulled ${external} of ${promptTotal}`);
      assert.ok(local <= n * 16, `D computed ${local} prompt tokens locally`);
      failed = false;
    });
  });
}
