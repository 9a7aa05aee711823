import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

// Mooncake is concurrent: P and D get their requests at the same time, D waits for P's KV.
// This exercises the core's PD hooks under that race (connector internals: test/engine/sim/pd).
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

  // vLLM's bootstrap /query (mooncake_utils.py @ e7ad92e5308e67c9657fc06f351ff4326848f130):
  // dict[dp_rank, {engine_id, worker_addr}]; D names the engine it pulls from.
  const engineId = async () => {
    const q = (await (await fetch(`http://127.0.0.1:${bootstrapPort}/query`)).json()) as Record<
      string,
      { engine_id: string }
    >;
    return q["0"].engine_id;
  };

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
          remote_engine_id: await engineId(),
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

  // mooncake_connector.py @ 00f4240ee6458263d76cf51ca7901ce1350bb4d1: a P request without
  // transfer_id only logs "Missing transfer_id in kv_transfer_params from router!"; the request
  // completes and its blocks are freed at once (request_finished returns (False, None)).
  it("P without transfer_id: the request completes (no error, no kv_transfer_params) and P keeps nothing", async () => {
    const r = await fetch(`${p.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        prompt: "A prompt of a few blocks for the dropped transfer. ".repeat(8),
        max_tokens: 1,
        kv_transfer_params: { do_remote_decode: true },
      }),
    });
    assert.equal(r.status, 200);
    const body = (await r.json()) as Record<string, unknown>;
    assert.equal(body.kv_transfer_params ?? null, null);
    const deadline = Date.now() + 3000;
    while ((parseMetric(await p.metrics(), "vllm:kv_cache_usage_perc") ?? 1) > 0) {
      assert.ok(Date.now() < deadline, "P freed the blocks at once");
      await new Promise((r) => setTimeout(r, 20));
    }
  });

  it("D naming an engine the bootstrap server does not list fails the load (502), not a silent success", async () => {
    const r = await fetch(`${d.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        prompt: "x",
        max_tokens: 3,
        kv_transfer_params: {
          do_remote_prefill: true,
          remote_bootstrap_addr: `http://127.0.0.1:${bootstrapPort}`,
          remote_engine_id: "some-other-engine",
          transfer_id: "xfer-e2e-2",
        },
      }),
    });
    assert.equal(r.status, 502);
    const err = ((await r.json()) as { error: { message: string } }).error;
    assert.match(err.message, /remote engine_id some-other-engine not found from bootstrap server/);
  });
});
