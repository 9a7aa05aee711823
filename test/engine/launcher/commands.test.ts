/**
 * Table-driven: every engine × role × connector produces the command line and environment
 * docs/engine-protocols.md lists (#launch, #kv-events-enable, the PD launch flags of #pd, #rdma).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { splitCommand } from "../../../src/engine/launcher/common.ts";
import { build, flagValue, json } from "./build.ts";

/**
 * vLLM MoRIIOConnector (vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_common.py @
 * 028a39c286ca87e0d302e66eda00bdb1a00b8c03, `MoRIIOConfig.from_vllm_config`): proxy_ip,
 * proxy_ping_port, http_port, handshake_port and notify_port are read as
 * `extra_config[key]` (no default); `read_mode` comes from the config only (default
 * "false" = WRITE), VLLM_MORIIO_CONNECTOR_READ_MODE is listed in _DEPRECATED_ENV_VARS and
 * ignored; `host_ip` overrides get_ip() (`resolve_host_ip`).
 */
const MORIIO_EXTRA = {
  proxy_ip: "10.0.0.9",
  proxy_ping_port: 36367,
  http_port: 8100,
  handshake_port: 6301,
  notify_port: 61005,
  read_mode: true,
  host_ip: "10.0.0.5",
};

describe("vLLM command lines", () => {
  const cases: Array<{
    role: "mixed" | "prefill" | "decode";
    connector?: string;
    transfer?: Record<string, unknown>;
    env: Record<string, string>;
    kind: string;
  }> = [
    { role: "mixed", env: {}, kind: "none" },
    {
      role: "prefill",
      connector: "nixl",
      transfer: { kv_connector: "NixlConnector", kv_role: "kv_both" },
      env: { VLLM_NIXL_SIDE_CHANNEL_PORT: "5600", VLLM_NIXL_SIDE_CHANNEL_HOST: "10.0.0.5" },
      kind: "nixl",
    },
    {
      role: "decode",
      connector: "nixl",
      transfer: { kv_connector: "NixlConnector", kv_role: "kv_both" },
      env: { VLLM_NIXL_SIDE_CHANNEL_PORT: "5600", VLLM_NIXL_SIDE_CHANNEL_HOST: "10.0.0.5" },
      kind: "nixl",
    },
    {
      role: "prefill",
      connector: "mooncake",
      transfer: { kv_connector: "MooncakeConnector", kv_role: "kv_producer" },
      env: { VLLM_MOONCAKE_BOOTSTRAP_PORT: "8998" },
      kind: "mooncake",
    },
    {
      role: "decode",
      connector: "mooncake",
      transfer: { kv_connector: "MooncakeConnector", kv_role: "kv_consumer" },
      env: { VLLM_MOONCAKE_BOOTSTRAP_PORT: "8998" },
      kind: "mooncake",
    },
    {
      role: "prefill",
      connector: "moriio",
      transfer: {
        kv_connector: "MoRIIOConnector",
        kv_role: "kv_producer",
        kv_connector_extra_config: MORIIO_EXTRA,
      },
      env: {},
      kind: "moriio",
    },
    {
      role: "decode",
      connector: "moriio",
      transfer: {
        kv_connector: "MoRIIOConnector",
        kv_role: "kv_consumer",
        kv_connector_extra_config: MORIIO_EXTRA,
      },
      env: {},
      kind: "moriio",
    },
  ];
  for (const c of cases) {
    it(`${c.role} ${c.connector ?? "no connector"}`, async () => {
      const moriioProxy = c.connector === "moriio" ? "10.0.0.9:36367" : undefined;
      const { cmd, record } = await build("vllm", { role: c.role, connector: c.connector, moriioProxy });
      assert.deepEqual(cmd.argv.slice(0, 7), [
        "vllm",
        "serve",
        "org/model",
        "--host",
        "0.0.0.0",
        "--port",
        "8100",
      ]);
      assert.deepEqual(json(cmd.argv, "--kv-events-config"), {
        enable_kv_cache_events: true,
        publisher: "zmq",
        endpoint: "tcp://*:5557",
        replay_endpoint: "tcp://*:5558",
        topic: "kv-events",
      });
      assert.deepEqual(json(cmd.argv, "--kv-transfer-config"), c.transfer);
      assert.deepEqual(cmd.env, c.env);
      assert.equal(record.connector.kind, c.kind);
      assert.equal(record.role, c.role);
      assert.equal(record.engine, "vllm");
      assert.deepEqual(record.kvEvents, {
        endpoint: "tcp://10.0.0.5:5557",
        replayEndpoint: "tcp://10.0.0.5:5558",
        topic: "kv-events",
        framing: "seq",
      });
    });
  }

  it("passes tp/dp/quantization/kv-cache-dtype/block-size/max-model-len, served names, and extra args last", async () => {
    const { cmd, record } = await build(
      "vllm",
      {
        tp: "8",
        dp: "2",
        quantization: "mxfp4",
        kvCacheDtype: "fp8",
        blockSize: "32",
        maxModelLen: "8192",
        servedModelName: ["a", "b,c"],
      },
      ["--enforce-eager", "--kv-events-config", "x y"],
    );
    const a = cmd.argv;
    assert.deepEqual(a.slice(a.indexOf("--served-model-name"), a.indexOf("--served-model-name") + 4), [
      "--served-model-name",
      "a",
      "b",
      "c",
    ]);
    assert.equal(flagValue(a, "--tensor-parallel-size"), "8");
    assert.equal(flagValue(a, "--data-parallel-size"), "2");
    assert.equal(flagValue(a, "--quantization"), "mxfp4");
    assert.equal(flagValue(a, "--kv-cache-dtype"), "fp8");
    assert.equal(flagValue(a, "--block-size"), "32");
    assert.equal(flagValue(a, "--max-model-len"), "8192");
    assert.deepEqual(a.slice(-3), ["--enforce-eager", "--kv-events-config", "x y"]);
    assert.deepEqual(record.servedModelNames, ["a", "b", "c"]);
    assert.equal(record.tpSize, 8);
    assert.equal(record.dpSize, 2);
    assert.equal(record.blockSize, 32);
    assert.equal(record.maxModelLen, 8192);
  });

  it("MoRIIO: the five required keys always present, or a clear refusal; never kv_both", async () => {
    await assert.rejects(
      build("vllm", { role: "prefill", connector: "moriio" }),
      /MoRIIO needs --moriio-proxy/,
    );
    await assert.rejects(
      build("vllm", { role: "mixed", connector: "moriio", moriioProxy: "10.0.0.9" }),
      /MoRIIO has no kv_both role/,
    );
    // The proxy port defaults to MoRIIO's 36367; no --advertise-host: no host_ip.
    const { cmd, record } = await build("vllm", {
      role: "decode",
      connector: "moriio",
      moriioProxy: "10.0.0.9",
      advertiseHost: undefined,
      moriioMode: "write",
    });
    // The record tells the router's MoRIIO protocol the mode (WRITE runs P and D together).
    assert.equal(record.connector.transferMode, "WRITE");
    const extra = json(cmd.argv, "--kv-transfer-config")?.kv_connector_extra_config as Record<
      string,
      unknown
    >;
    for (const key of ["proxy_ip", "proxy_ping_port", "http_port", "handshake_port", "notify_port"]) {
      assert.ok(key in extra, key);
    }
    assert.equal(extra.proxy_ping_port, 36367);
    assert.equal(extra.read_mode, false);
    assert.equal("host_ip" in extra, false);
    assert.equal(cmd.env.VLLM_MORIIO_CONNECTOR_READ_MODE, undefined);
    await assert.rejects(
      build("vllm", { role: "decode", connector: "moriio", moriioProxy: "h", moriioMode: "pull" }),
      /--moriio-mode/,
    );
  });

  it("--engine-bin replaces the executable words; --no-kv-events drops the config and the record's kvEvents", async () => {
    const { cmd, record } = await build("vllm", {
      engineBin: "node '/opt/my dir/bin/infera-sim.js'",
      kvEvents: false,
    });
    assert.deepEqual(cmd.argv.slice(0, 4), ["node", "/opt/my dir/bin/infera-sim.js", "serve", "org/model"]);
    assert.equal(cmd.argv.includes("--kv-events-config"), false);
    assert.equal(record.kvEvents, undefined);
  });

  it("prefill/decode without --connector defaults to Nixl; unknown connectors are refused", async () => {
    const { record } = await build("vllm", { role: "prefill" });
    assert.equal(record.connector.kind, "nixl");
    await assert.rejects(build("vllm", { role: "prefill", connector: "sglang" }), /not supported/);
    await assert.rejects(build("vllm", { role: "decode", connector: "none" }), /needs a KV connector/);
    await assert.rejects(build("vllm", { connector: "bogus" }), /unknown --connector/);
    await assert.rejects(build("vllm", { role: "primary" }), /--role must be/);
    await assert.rejects(build("vllm", { port: "70000" }), /--port/);
  });
});

describe("SGLang command lines", () => {
  for (const role of ["prefill", "decode"] as const) {
    for (const backend of ["mooncake", "nixl", "mori"]) {
      it(`${role} ${backend}`, async () => {
        const { cmd, record } = await build("sglang", { role, connector: backend, ibDevice: "ionic_0" });
        const a = cmd.argv;
        assert.deepEqual(a.slice(0, 3), ["python", "-m", "sglang.launch_server"]);
        assert.equal(flagValue(a, "--model-path"), "org/model");
        assert.equal(flagValue(a, "--port"), "8100");
        assert.equal(flagValue(a, "--disaggregation-mode"), role);
        assert.equal(flagValue(a, "--disaggregation-transfer-backend"), backend);
        assert.equal(flagValue(a, "--disaggregation-bootstrap-port"), "8998");
        assert.equal(flagValue(a, "--disaggregation-ib-device"), "ionic_0");
        assert.ok(a.includes("--enable-metrics"));
        assert.deepEqual(json(a, "--kv-events-config"), {
          publisher: "zmq",
          endpoint: "tcp://*:5557",
          replay_endpoint: "tcp://*:5558",
          topic: "kv-events",
        });
        assert.deepEqual(record.connector, {
          kind: "sglang",
          bootstrapHost: "10.0.0.5",
          bootstrapPort: 8998,
        });
        assert.equal(record.labels?.transferBackend, backend);
        assert.equal(record.kvEvents?.framing, "seq");
      });
    }
  }

  it("mixed: no disaggregation flags; tp/dp/quantization/kv-cache-dtype mapped", async () => {
    // sgl-project/sglang python/sglang/srt/server_args.py @ 001067fffe33427bee0ed2f007fb7551a1d76b44:
    // the CLI flag is derived from the field name (tp_size → --tp-size, dp_size → --dp-size);
    // `--tp`/`--dp` only parse as argparse abbreviations.
    const { cmd, record } = await build(
      "sglang",
      { tp: "4", dp: "2", quantization: "fp8", kvCacheDtype: "fp8" },
      ["--enable-dp-attention"],
    );
    const a = cmd.argv;
    assert.equal(a.includes("--disaggregation-mode"), false);
    assert.equal(flagValue(a, "--tp-size"), "4");
    assert.equal(flagValue(a, "--dp-size"), "2");
    assert.equal(a.includes("--tp"), false);
    assert.equal(a.includes("--dp"), false);
    assert.equal(flagValue(a, "--quantization"), "fp8");
    assert.equal(flagValue(a, "--kv-cache-dtype"), "fp8_e4m3");
    assert.ok(a.includes("--enable-metrics"));
    assert.equal(record.connector.kind, "none");
    assert.equal(record.blockSize, 1);
  });

  it("moriio is accepted as SGLang's mori; a connector without a PD role is refused", async () => {
    const { cmd } = await build("sglang", { role: "decode", connector: "moriio" });
    assert.equal(flagValue(cmd.argv, "--disaggregation-transfer-backend"), "mori");
    await assert.rejects(build("sglang", { connector: "mooncake" }), /needs --role/);
  });

  it("`sglang serve` as --engine-bin keeps the same arguments; one served name only", async () => {
    const { cmd } = await build("sglang", { engineBin: "sglang serve", servedModelName: ["alias"] });
    assert.deepEqual(cmd.argv.slice(0, 4), ["sglang", "serve", "--model-path", "org/model"]);
    assert.equal(flagValue(cmd.argv, "--served-model-name"), "alias");
    // server_args.py: served_model_name is one str; a second alias would be advertised but refused.
    await assert.rejects(build("sglang", { servedModelName: ["a,b"] }), /takes one name/);
  });
});

describe("sim command lines", () => {
  it("uses the vLLM command line with the sim's --role/--connector", async () => {
    const { cmd, record } = await build("sim", { role: "prefill", connector: "mooncake" });
    const a = cmd.argv;
    assert.equal(a[0], process.execPath);
    assert.match(a[1] as string, /bin\/infera-sim\.js$/);
    assert.deepEqual(a.slice(2, 4), ["serve", "org/model"]);
    assert.deepEqual(json(a, "--kv-transfer-config"), {
      kv_connector: "MooncakeConnector",
      kv_role: "kv_producer",
    });
    assert.equal(flagValue(a, "--role"), "prefill");
    assert.equal(flagValue(a, "--connector"), "mooncake");
    assert.equal(record.engine, "sim");
    assert.equal(record.kvEvents?.framing, "seq");
  });

  it("sglang / atom protocols carry their ports in the transfer config", async () => {
    const s = await build("sim", { role: "prefill", connector: "sglang", bootstrapPort: "9000" });
    assert.deepEqual(json(s.cmd.argv, "--kv-transfer-config"), {
      kv_connector: "sglang",
      kv_role: "kv_producer",
      bootstrap_port: 9000,
    });
    assert.deepEqual(s.record.connector, { kind: "sglang", bootstrapHost: "10.0.0.5", bootstrapPort: 9000 });
    const t = await build("sim", { role: "decode", connector: "atom" });
    assert.equal(json(t.cmd.argv, "--kv-transfer-config")?.handshake_port, 6301);
    assert.equal(t.record.connector.kind, "atom");
  });
});

describe("RDMA environment", () => {
  // MORI_IB_GID_INDEX: ROCm/mori src/io/rdma/backend_impl.cpp @ 624002c897a30928ec04c14fc167bf2b8a93f6ce
  // (getenv("MORI_IB_GID_INDEX")); UCX_IB_GID_INDEX: openucx/ucx src/uct/ib/base/ib_iface.c @
  // a9aeeea35fbe922fa4cb68a66521b84f0de80979 (IB iface config GID_INDEX, UCX_IB_ prefix).
  for (const engine of ["vllm", "sglang", "atom", "sim"] as const) {
    it(`${engine}: --gid-index sets MC_, NCCL_IB_, MORI_IB_ and UCX_IB_GID_INDEX`, async () => {
      const { cmd } = await build(engine, { gidIndex: "3" });
      assert.equal(cmd.env.MC_GID_INDEX, "3");
      assert.equal(cmd.env.NCCL_IB_GID_INDEX, "3");
      assert.equal(cmd.env.MORI_IB_GID_INDEX, "3");
      assert.equal(cmd.env.UCX_IB_GID_INDEX, "3");
    });
  }
});

describe("splitCommand", () => {
  it("splits words with quotes and escapes", () => {
    assert.deepEqual(splitCommand(`node "/a b/c.js"  --x 'y z' d\\ e`), [
      "node",
      "/a b/c.js",
      "--x",
      "y z",
      "d e",
    ]);
    assert.throws(() => splitCommand(`node "x`), /unterminated/);
  });
});
