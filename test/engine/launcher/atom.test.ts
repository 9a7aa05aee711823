/** ATOM's command line and record, table-driven like commands.test.ts. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { build, flagValue, json } from "./build.ts";

/*
 * ROCm/ATOM @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21: atom/model_engine/arg_utils.py
 * (--model, --served-model-name (one str), --tensor-parallel-size/-tp,
 * --data-parallel-size/-dp, --kv_cache_dtype choices ["bf16", "fp8"], --block-size,
 * --max-model-len, --port = engine internal port, --kv-transfer-config JSON);
 * atom/entrypoints/openai/api_server.py (--host, --server-port; `validate_model` answers 400
 * unless the request's model equals the served name); connectors
 * atom/kv_transfer/disaggregation/{moriio,mooncake}/*_connector.py read kv_role,
 * handshake_port and http_port (default 8000) from the transfer config.
 */
describe("ATOM command lines", () => {
  for (const role of ["prefill", "decode"] as const) {
    for (const backend of ["moriio", "mooncake"]) {
      it(`${role} ${backend}`, async () => {
        const { cmd, record } = await build("atom", {
          role,
          connector: backend,
          tp: "8",
          kvCacheDtype: "fp8",
          blockSize: "16",
        });
        const a = cmd.argv;
        assert.deepEqual(a.slice(0, 5), [
          "python",
          "-m",
          "atom.entrypoints.openai_server",
          "--model",
          "org/model",
        ]);
        assert.equal(flagValue(a, "--tensor-parallel-size"), "8");
        assert.equal(flagValue(a, "--kv_cache_dtype"), "fp8");
        assert.equal(flagValue(a, "--block-size"), "16");
        assert.equal(flagValue(a, "--host"), "0.0.0.0");
        assert.equal(flagValue(a, "--server-port"), "8100");
        assert.equal(a.includes("--port"), false, "ATOM's --port is internal");
        assert.deepEqual(json(a, "--kv-transfer-config"), {
          kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
          kv_connector: backend,
          handshake_port: 6301,
          http_port: 8100,
        });
        assert.deepEqual(cmd.env, {
          ATOM_KV_EVENTS_ENABLE: "1",
          ATOM_KV_EVENTS_PUBLISHER: "zmq",
          ATOM_KV_EVENTS_ENDPOINT: "tcp://*:5557",
          ATOM_KV_EVENTS_TOPIC: "kv-events",
        });
        assert.deepEqual(record.connector, { kind: "atom", bootstrapHost: "10.0.0.5", handshakePort: 6301 });
        assert.deepEqual(record.kvEvents, {
          endpoint: "tcp://10.0.0.5:5557",
          topic: "kv-events",
          framing: "atom",
        });
      });
    }
  }

  it("mixed: no transfer config; quantization refused with a clear message", async () => {
    const { cmd } = await build("atom");
    assert.equal(cmd.argv.includes("--kv-transfer-config"), false);
    await assert.rejects(build("atom", { quantization: "fp8" }), /checkpoint/);
  });

  it("served name, dp, max-model-len and host reach ATOM; the record advertises what ATOM serves", async () => {
    const { cmd, record } = await build("atom", {
      servedModelName: ["alias"],
      dp: "2",
      kvEvents: false,
      maxModelLen: "4096",
      host: "10.0.0.5",
    });
    const a = cmd.argv;
    assert.equal(flagValue(a, "--served-model-name"), "alias");
    assert.deepEqual(record.servedModelNames, ["alias"]);
    assert.equal(flagValue(a, "--data-parallel-size"), "2");
    assert.equal(flagValue(a, "--max-model-len"), "4096");
    assert.equal(flagValue(a, "--host"), "10.0.0.5");
    assert.equal(record.dpSize, 2);
    await assert.rejects(build("atom", { servedModelName: ["a", "b"] }), /takes one name/);
  });

  it("--kv-cache-dtype maps onto ATOM's bf16|fp8; anything else is refused", async () => {
    for (const [given, passed] of [
      ["fp8", "fp8"],
      ["fp8_e4m3", "fp8"],
      ["bf16", "bf16"],
      ["bfloat16", "bf16"],
      ["auto", undefined],
    ] as const) {
      const { cmd } = await build("atom", { kvCacheDtype: given });
      assert.equal(flagValue(cmd.argv, "--kv_cache_dtype"), passed, given);
    }
    for (const d of ["fp8_e5m2", "fp4", "int8"]) {
      await assert.rejects(build("atom", { kvCacheDtype: d }), /ATOM takes bf16 or fp8/);
    }
  });
});
