import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

// Two spawned sims with the real Nixl connector: P prefills and holds, D pulls over the side
// channel and decodes. Checks the core's PD hooks end to end (connector internals are tested
// in test/engine/sim/pd).
describe("sim PD end to end (nixl, two processes)", () => {
  let p: SimProcess;
  let d: SimProcess;
  const ktc = (role: string) =>
    JSON.stringify({
      kv_connector: "NixlConnector",
      kv_role: role,
      kv_connector_extra_config: { side_channel_port: 0 },
    });

  before(async () => {
    [p, d] = await Promise.all([
      startSim({ args: ["--speed", "50", "--role", "prefill", "--kv-transfer-config", ktc("kv_both")] }),
      startSim({ args: ["--speed", "50", "--role", "decode", "--kv-transfer-config", ktc("kv_both")] }),
    ]);
  });
  after(async () => {
    await Promise.all([p?.stop(), d?.stop()]);
  });

  it("P then D gives the answer; D computes only the last prompt token; P frees its blocks", async () => {
    const messages = [{ role: "user", content: "Explain disaggregated serving in detail. ".repeat(12) }];
    const id = "pd-e2e-1";
    const pr = await fetch(`${p.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": id },
      body: JSON.stringify({
        model: p.model,
        messages,
        max_tokens: 1,
        stream: false,
        kv_transfer_params: {
          do_remote_decode: true,
          do_remote_prefill: false,
          remote_engine_id: null,
          remote_block_ids: null,
          remote_host: null,
          remote_port: null,
        },
      }),
    });
    assert.equal(pr.status, 200);
    const pBody = (await pr.json()) as {
      kv_transfer_params: Record<string, unknown>;
      usage: { prompt_tokens: number };
    };
    const params = pBody.kv_transfer_params;
    assert.equal(params.do_remote_prefill, true);
    const prompt = pBody.usage.prompt_tokens;
    // vllm-project/vllm nixl/pull_scheduler.py @ 0050936b22adda2ef0197fa3bb2551fe6c5437dc: one
    // block-id list per KV cache group, and the prefill's computed tokens.
    const groups = params.remote_block_ids as number[][];
    assert.equal(groups.length, 1);
    assert.equal(groups[0].length, Math.ceil(prompt / 16));
    assert.equal(params.remote_num_tokens, prompt);
    const pm = await p.metrics();
    assert.ok((parseMetric(pm, "vllm:kv_cache_usage_perc") ?? 0) > 0, "P holds the blocks");

    const client = new OpenAI({
      baseURL: `${d.url}/v1`,
      apiKey: "none",
      maxRetries: 0,
      defaultHeaders: { "x-request-id": id },
    });
    // kv_transfer_params is a vLLM extension: the openai client passes unknown fields through.
    const body = {
      model: d.model,
      messages: messages as OpenAI.ChatCompletionMessageParam[],
      max_tokens: 12,
      stream: true as const,
      stream_options: { include_usage: true },
      kv_transfer_params: params,
    };
    const stream = await client.chat.completions.create(body);
    let text = "";
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    assert.ok(text.length > 0);
    assert.equal(usage?.prompt_tokens, prompt);
    assert.equal(usage?.completion_tokens, 12);
    const dm = await d.metrics();
    assert.equal(
      parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }),
      prompt - 1,
    );
    assert.equal(parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "local_compute" }), 1);
    const deadline = Date.now() + 3000;
    while ((parseMetric(await p.metrics(), "vllm:kv_cache_usage_perc") ?? 1) > 0) {
      assert.ok(Date.now() < deadline, "P released the held blocks after the pull");
      await new Promise((r) => setTimeout(r, 20));
    }
  });
});
