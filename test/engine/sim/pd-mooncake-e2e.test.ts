import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

// Mooncake is concurrent: P and D get their requests at the same time, D waits for P's KV.
// This exercises the core's PD hooks under that race (connector internals: test/engine/sim-pd).
describe("sim PD end to end (mooncake, concurrent, two processes)", () => {
  let p: SimProcess;
  let d: SimProcess;
  let bootstrapPort: number;

  before(async () => {
    bootstrapPort = await freePort();
    const ktc = (role: string) => JSON.stringify({ kv_connector: "MooncakeConnector", kv_role: role });
    [p, d] = await Promise.all([
      startSim({
        args: ["--speed", "20", "--kv-transfer-config", ktc("kv_producer")],
        env: { VLLM_MOONCAKE_BOOTSTRAP_PORT: String(bootstrapPort) },
      }),
      startSim({ args: ["--speed", "20", "--kv-transfer-config", ktc("kv_consumer")] }),
    ]);
  });
  after(async () => {
    await Promise.all([p?.stop(), d?.stop()]);
  });

  it("P and D at once: D answers without recomputing P's prompt", async () => {
    const prompt = "A long shared document about caches and transfers. ".repeat(30);
    const transferId = "xfer-e2e-1";
    const post = (url: string, body: Record<string, unknown>) =>
      fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-request-id": "mc-1" },
        body: JSON.stringify({ model: "sim-model", prompt, ...body }),
      });
    const [pr, dr] = await Promise.all([
      post(p.url, {
        max_tokens: 1,
        kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, transfer_id: transferId },
      }),
      post(d.url, {
        max_tokens: 10,
        kv_transfer_params: {
          do_remote_decode: false,
          do_remote_prefill: true,
          remote_bootstrap_addr: `http://127.0.0.1:${bootstrapPort}`,
          remote_engine_id: "unused-by-sim",
          remote_dp_rank: 0,
          transfer_id: transferId,
        },
      }),
    ]);
    assert.equal(pr.status, 200, await pr.clone().text());
    assert.equal(dr.status, 200, await dr.clone().text());
    const dBody = (await dr.json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
    assert.equal(dBody.usage.completion_tokens, 10);
    const n = dBody.usage.prompt_tokens;
    const dm = await d.metrics();
    assert.equal(
      parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }),
      n - 1,
    );
    assert.equal(parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "local_compute" }), 1);
    const pm = await p.metrics();
    assert.equal(parseMetric(pm, "vllm:prompt_tokens_by_source_total", { source: "local_compute" }), n);
  });

  it("P drops a PD request without transfer_id with a 400", async () => {
    const r = await fetch(`${p.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        prompt: "x",
        max_tokens: 1,
        kv_transfer_params: { do_remote_decode: true },
      }),
    });
    assert.equal(r.status, 400);
  });
});
