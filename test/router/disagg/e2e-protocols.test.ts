/**
 * End to end, per protocol, 1P1D: the official openai client → `infera server --discovery
 * static` → P and D sims. Chat and completions, streamed and not; usage covers the whole
 * request; D's answer carries the client's request id; D's metrics show it computed only
 * what it did not pull; P ends holding nothing.
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
  waitFor,
} from "./pd-cluster.ts";

const KINDS: PdKind[] = ["nixl", "mooncake", "moriio", "sglang", "atom"];

// MoRIIO also in WRITE mode (vLLM's default: moriio_common.py get_moriio_mode), where the
// router sends both halves at once and D's engine/block ids stay null.
const CASES: Array<{ kind: PdKind; moriioMode?: "READ" | "WRITE" }> = [
  ...KINDS.map((kind) => ({ kind })),
  { kind: "moriio", moriioMode: "WRITE" },
];

for (const { kind, moriioMode } of CASES) {
  describe(`e2e 1P1D ${kind}${moriioMode ? ` ${moriioMode}` : ""}`, () => {
    let c: PdCluster;
    before(async () => {
      c = await startPdCluster({ kind, moriioMode });
    });
    after(async () => {
      await c?.close();
    });

    test("the server routes the model disaggregated", async () => {
      const body = (await (await fetch(`${c.url}/v1/workers`)).json()) as unknown;
      assert.match(JSON.stringify(body), /disagg/);
    });

    test("chat, not streamed: full answer, D's usage, request id shared, no recompute on D", async () => {
      const before = await promptSources(c.decodes[0].sim);
      const rid = `e2e-${kind}-0123456789abcdef0123456789abcdef`;
      const r = await c.client.chat.completions.create(
        { model: MODEL, messages: [{ role: "user", content: longPrompt(`${kind}-chat`) }], max_tokens: 10 },
        { headers: { "x-request-id": rid } },
      );
      assert.equal(r.choices[0].finish_reason, "length");
      assert.ok((r.choices[0].message.content ?? "").length > 0);
      assert.equal(r.usage?.completion_tokens, 10);
      const prompt = r.usage?.prompt_tokens ?? 0;
      assert.ok(prompt > 150, `prompt_tokens ${prompt}`);
      if (kind !== "moriio") assert.equal(r.id, `chatcmpl-${rid}`, "D ran under the client's request id");
      else
        assert.match(r.id, /___prefill_addr_host:127\.0\.0\.1.*___decode_addr_/, "MoRIIO's request-id form");
      const after = await promptSources(c.decodes[0].sim);
      const pulled = after.external - before.external;
      const local = after.local - before.local;
      assert.ok(pulled >= prompt - 16, `D pulled ${pulled} of ${prompt} prompt tokens`);
      assert.ok(local <= 16, `D computed ${local} prompt tokens itself`);
      const pSrc = await promptSources(c.prefills[0].sim);
      assert.ok(pSrc.local >= prompt - 16, "P computed the prompt");
    });

    test("chat, streamed with usage: chunks from D, usage of the whole request", async () => {
      const stream = await c.client.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: longPrompt(`${kind}-stream`) }],
        max_tokens: 8,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = "";
      let usage: { prompt_tokens: number; completion_tokens: number } | null = null;
      let chunks = 0;
      for await (const ch of stream) {
        chunks++;
        text += ch.choices[0]?.delta?.content ?? "";
        if (ch.usage) usage = ch.usage;
      }
      // The sim may coalesce several tokens into one SSE chunk; usage says how many there were.
      assert.ok(chunks >= 2, "content chunks and the usage chunk");
      assert.ok(text.length > 0);
      assert.equal(usage?.completion_tokens, 8);
      assert.ok((usage?.prompt_tokens ?? 0) > 150);
    });

    test("completions, streamed without usage, and not streamed", async () => {
      const prompt = longPrompt(`${kind}-completion`);
      const r = await c.client.completions.create({ model: MODEL, prompt, max_tokens: 6 });
      assert.equal(r.usage?.completion_tokens, 6);
      const stream = await c.client.completions.create({
        model: MODEL,
        prompt: `${prompt} again`,
        max_tokens: 5,
        stream: true,
      });
      let n = 0;
      let sawUsage = false;
      for await (const ch of stream) {
        if (ch.choices.length > 0) n++;
        if (ch.usage) sawUsage = true;
      }
      assert.ok(n >= 1);
      assert.equal(sawUsage, false, "no usage chunk the client did not ask for");
    });

    test("afterwards P holds no blocks and D runs nothing", async () => {
      await waitFor(
        async () => (await metric(c.prefills[0].sim, "vllm:kv_cache_usage_perc")) === 0,
        5000,
        "P to free its blocks",
      );
      assert.equal(await metric(c.decodes[0].sim, "vllm:num_requests_running"), 0);
    });
  });
}
