import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { parseMetric, type SimProcess, startSim } from "../../helpers/sim.ts";

// The serial protocols besides Nixl (see pd-e2e.test.ts): P answers with kv_transfer_params,
// the caller forwards them to D. Exercises the core's PD hooks per connector; connector
// internals are tested in test/engine/sim/pd.
const cases = [
  {
    name: "moriio (read mode)",
    args: (role: string) => [
      "--kv-transfer-config",
      JSON.stringify({
        kv_connector: "MoRIIOConnector",
        kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
        // proxy_ip / proxy_ping_port / http_port are required (moriio_common.py
        // @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03); nothing listens on that proxy port.
        kv_connector_extra_config: {
          proxy_ip: "127.0.0.1",
          proxy_ping_port: 9,
          http_port: 0,
          handshake_port: 0,
          notify_port: 0,
          read_mode: true,
        },
      }),
    ],
    toPrefill: { transfer_id: "serial-moriio-tx" } as Record<string, unknown>,
    toDecode: (p: Record<string, unknown>) => ({ ...p, do_remote_prefill: true, do_remote_decode: false }),
  },
  {
    name: "atom relay",
    args: (role: string) => [
      "--connector",
      "atom",
      "--role",
      role,
      "--kv-transfer-config",
      JSON.stringify({
        kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
        kv_connector: "moriio",
        handshake_port: 0,
      }),
    ],
    toPrefill: {} as Record<string, unknown>,
    // ATOM's D reads remote_dp_size / remote_tp_size / remote_dp_rank with defaults
    // (ROCm/ATOM atom/kv_transfer/disaggregation/types.py @ ffdf3bb5d): P's answer alone suffices.
    toDecode: (p: Record<string, unknown>) => p,
  },
];

for (const c of cases) {
  describe(`sim PD end to end (${c.name}, two processes)`, () => {
    let p: SimProcess;
    let d: SimProcess;
    before(async () => {
      [p, d] = await Promise.all([
        startSim({ args: ["--speed", "50", ...c.args("prefill")] }),
        startSim({ args: ["--speed", "50", ...c.args("decode")] }),
      ]);
    });
    after(async () => {
      await Promise.all([p?.stop(), d?.stop()]);
    });

    it("P then D: D prefills only the last prompt token, P frees its blocks", async () => {
      const id = `serial-${c.name.split(" ")[0]}`;
      const post = (url: string, body: Record<string, unknown>) =>
        fetch(`${url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-request-id": id },
          body: JSON.stringify({
            model: "sim-model",
            prompt: "Serial transfer test prompt. ".repeat(20),
            ...body,
          }),
        });
      const pr = await post(p.url, {
        max_tokens: 1,
        stream: false,
        kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, ...c.toPrefill },
      });
      assert.equal(pr.status, 200, await pr.clone().text());
      const pBody = (await pr.json()) as { kv_transfer_params: Record<string, unknown> };
      assert.ok(pBody.kv_transfer_params, "P answers with kv_transfer_params");
      const dr = await post(d.url, {
        max_tokens: 6,
        kv_transfer_params: c.toDecode(pBody.kv_transfer_params),
      });
      assert.equal(dr.status, 200, await dr.clone().text());
      const dBody = (await dr.json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
      assert.equal(dBody.usage.completion_tokens, 6);
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
  });
}
