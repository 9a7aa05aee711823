/**
 * vLLM MoRIIOConnector on two sim processes, with the request shapes of vLLM's MoRIIO proxy
 * and the failures vLLM has. Sources: vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_connector.py
 * @ 0158326ccc22cff86725bbaa452df5e6be966c5c (update_state_after_alloc reads
 * params["transfer_id"]; request_finished echoes it; WRITE-mode D notifies P "remote_blocks"),
 * moriio/moriio_common.py @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03 (MoRIIOConfig reads
 * proxy_ip / proxy_ping_port / http_port without defaults; read_mode defaults to false = WRITE),
 * examples/online_serving/disaggregated_serving/moriio_toy_proxy_server.py
 * @ 0b0c33d59ee576f335a61eec4e1f837969f01008 (P gets D's remote_host / remote_port /
 * remote_handshake_port / remote_notify_port and D gets P's; WRITE sends both at once).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

const cfg = (role: string, extra: Record<string, unknown>) =>
  JSON.stringify({
    kv_connector: "MoRIIOConnector",
    kv_role: role,
    kv_connector_extra_config: extra,
  });

describe("sim PD end to end (moriio WRITE, two processes)", () => {
  let p: SimProcess;
  let d: SimProcess;
  const ports = { pHs: 0, pNt: 0, dHs: 0, dNt: 0 };

  before(async () => {
    for (const k of Object.keys(ports) as (keyof typeof ports)[]) ports[k] = await freePort();
    const common = { proxy_ip: "127.0.0.1", proxy_ping_port: 9, http_port: 0 };
    [p, d] = await Promise.all([
      startSim({
        args: [
          "--speed",
          "20",
          "--kv-transfer-config",
          cfg("kv_producer", { ...common, handshake_port: ports.pHs, notify_port: ports.pNt }),
        ],
      }),
      startSim({
        args: [
          "--speed",
          "20",
          "--kv-transfer-config",
          cfg("kv_consumer", { ...common, handshake_port: ports.dHs, notify_port: ports.dNt }),
        ],
      }),
    ]);
  });
  after(async () => {
    await Promise.all([p?.stop(), d?.stop()]);
  });

  const post = (url: string, rid: string, body: Record<string, unknown>) =>
    fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": rid },
      body: JSON.stringify({
        model: "sim-model",
        prompt: "Write mode moves KV while P runs. ".repeat(20),
        ...body,
      }),
    });

  it("P and D at once (WRITE is the default): D decodes on the moved KV, P echoes transfer_id and frees", async () => {
    const [pr, dr] = await Promise.all([
      post(p.url, "w-e2e-1", {
        max_tokens: 1,
        kv_transfer_params: {
          do_remote_decode: true,
          do_remote_prefill: false,
          transfer_id: "w-e2e-tx",
          remote_host: "127.0.0.1",
          remote_port: d.port,
          remote_handshake_port: ports.dHs,
          remote_notify_port: ports.dNt,
          remote_engine_id: null,
          remote_block_ids: null,
        },
      }),
      post(d.url, "w-e2e-1", {
        max_tokens: 5,
        kv_transfer_params: {
          do_remote_decode: false,
          do_remote_prefill: true,
          transfer_id: "w-e2e-tx",
          remote_host: "127.0.0.1",
          remote_port: p.port,
          remote_handshake_port: ports.pHs,
          remote_notify_port: ports.pNt,
          remote_engine_id: null,
          remote_block_ids: null,
        },
      }),
    ]);
    assert.equal(pr.status, 200, await pr.clone().text());
    assert.equal(dr.status, 200, await dr.clone().text());
    const pBody = (await pr.json()) as { kv_transfer_params: Record<string, unknown> };
    assert.equal(pBody.kv_transfer_params.transfer_id, "w-e2e-tx");
    assert.equal(pBody.kv_transfer_params.remote_handshake_port, ports.pHs);
    assert.equal(pBody.kv_transfer_params.remote_notify_port, ports.pNt);
    const dBody = (await dr.json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
    assert.equal(dBody.usage.completion_tokens, 5);
    const dm = await d.metrics();
    assert.equal(
      parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }),
      dBody.usage.prompt_tokens - 1,
    );
    const deadline = Date.now() + 3000;
    while ((parseMetric(await p.metrics(), "vllm:kv_cache_usage_perc") ?? 1) > 0) {
      assert.ok(Date.now() < deadline, "P released the held blocks");
      await new Promise((r) => setTimeout(r, 20));
    }
  });

  it("a request with kv_transfer_params but no transfer_id is a 500 naming the field, on P and on D", async () => {
    for (const [s, params] of [
      [
        p,
        {
          do_remote_decode: true,
          remote_host: "127.0.0.1",
          remote_handshake_port: ports.dHs,
          remote_notify_port: ports.dNt,
        },
      ],
      [
        d,
        {
          do_remote_prefill: true,
          remote_host: "127.0.0.1",
          remote_handshake_port: ports.pHs,
          remote_notify_port: ports.pNt,
        },
      ],
    ] as const) {
      const r = await post(s.url, "no-tx", { max_tokens: 2, kv_transfer_params: params });
      assert.equal(r.status, 500);
      const e = ((await r.json()) as { error: Record<string, unknown> }).error;
      assert.match(String(e.message), /KeyError: 'transfer_id'/);
      assert.equal(e.type, "server_error");
      assert.equal(parseMetric(await s.metrics(), "vllm:num_requests_running"), 0);
    }
    const ok = await post(d.url, "plain", { max_tokens: 2 });
    assert.equal(ok.status, 200, "an ordinary request (no kv_transfer_params) still runs");
  });
});

describe("sim MoRIIO start-up", () => {
  it("a worker without proxy_ip refuses to start: KeyError naming the key, non-zero exit", async () => {
    await assert.rejects(
      startSim({
        args: [
          "--kv-transfer-config",
          cfg("kv_producer", { proxy_ping_port: 9, http_port: 0, handshake_port: 0, notify_port: 0 }),
        ],
      }),
      (e) => {
        assert.match((e as Error).message, /infera-sim exited with 1/);
        assert.match((e as Error).message, /KeyError: 'proxy_ip'/);
        return true;
      },
    );
  });
});
