import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { describe, it } from "node:test";
import { parseSimArgs } from "../../../src/engine/sim/args.ts";
import { offsetEndpointPort } from "../../../src/engine/sim/config.ts";

describe("sim command line (vLLM-compatible)", () => {
  it("takes vLLM's serve MODEL form, flag=value, -tp/-dp and several served model names", () => {
    const { config, ignored } = parseSimArgs([
      "serve",
      "meta-llama/Llama-3.1-8B-Instruct",
      "--served-model-name",
      "llama",
      "llama-8b",
      "--port=8123",
      "--block-size",
      "32",
      "--num-gpu-blocks-override",
      "500",
      "--max-num-seqs",
      "16",
      "--max_num_batched_tokens",
      "1024",
      "--max-model-len",
      "4096",
      "-tp",
      "2",
      "-dp",
      "4",
      "--data-parallel-rank",
      "1",
      "--gpu-memory-utilization",
      "0.9",
      "--trust-remote-code",
      "--enable-prefix-caching",
      "--speed",
      "20",
      "--seed",
      "5",
    ]);
    assert.equal(config.model, "meta-llama/Llama-3.1-8B-Instruct");
    assert.deepEqual(config.servedModelNames, ["llama", "llama-8b"]);
    assert.equal(config.port, 8123);
    assert.equal(config.blockSize, 32);
    assert.equal(config.numGpuBlocks, 500);
    assert.equal(config.maxNumSeqs, 16);
    assert.equal(config.maxNumBatchedTokens, 1024);
    assert.equal(config.maxModelLen, 4096);
    assert.equal(config.tpSize, 2);
    assert.equal(config.dpSize, 4);
    assert.equal(config.dpRank, 1);
    // --data-parallel-rank: this process is that one rank (vLLM's external DP load balancing).
    assert.equal(config.dpLocal, false);
    assert.equal(config.speed, 20);
    assert.equal(config.seed, 5);
    assert.equal(config.role, "mixed");
    assert.equal(config.connector, "none");
    assert.equal(config.kvEvents, null);
    assert.ok(ignored.includes("--gpu-memory-utilization=0.9"));
    assert.ok(ignored.includes("--trust-remote-code"));
  });

  it("derives role and connector from --kv-transfer-config; --role/--connector win", () => {
    const mc = parseSimArgs([
      "--model",
      "m",
      "--kv-transfer-config",
      '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}',
    ]).config;
    assert.equal(mc.role, "prefill");
    assert.equal(mc.connector, "mooncake");
    assert.equal(mc.kvTransferConfig.kv_connector, "MooncakeConnector");
    const mori = parseSimArgs([
      "--kv-transfer-config",
      '{"kv_connector":"MoRIIOConnector","kv_role":"kv_consumer"}',
    ]).config;
    assert.equal(mori.role, "decode");
    assert.equal(mori.connector, "moriio");
    const nixl = parseSimArgs([
      "--kv-transfer-config",
      '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
      "--role",
      "decode",
    ]).config;
    assert.equal(nixl.connector, "nixl");
    assert.equal(nixl.role, "decode");
    assert.equal(parseSimArgs(["--connector", "sglang", "--role", "prefill"]).config.connector, "sglang");
  });

  it("parses --kv-events-config with vLLM's fields and defaults; disabled configs give no publisher", () => {
    const c = parseSimArgs([
      "--kv-events-config",
      '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv","buffer_steps":50}',
      "--kv-events-encoding",
      "map",
    ]).config;
    assert.equal(c.kvEvents?.endpoint, "tcp://*:5557");
    assert.equal(c.kvEvents?.replay_endpoint, "tcp://*:5558");
    assert.equal(c.kvEvents?.topic, "kv");
    assert.equal(c.kvEvents?.buffer_steps, 50);
    assert.equal(c.kvEvents?.hwm, 100000);
    assert.equal(c.kvEventsEncoding, "map");
    assert.equal(
      parseSimArgs(["--kv-events-config", '{"enable_kv_cache_events":false}']).config.kvEvents,
      null,
    );
    // SGLang's form has no enable field: on.
    assert.ok(
      parseSimArgs(["--kv-events-config", '{"publisher":"zmq","endpoint":"tcp://*:6000"}']).config.kvEvents,
    );
    assert.equal(offsetEndpointPort("tcp://*:5557", 2), "tcp://*:5559");
  });

  it("rejects bad values with a clear message", () => {
    assert.throws(() => parseSimArgs(["--role", "both"]), /argument --role: invalid choice/);
    assert.throws(() => parseSimArgs(["--block-size", "0"]), /argument --block-size: invalid int value/);
    assert.throws(() => parseSimArgs(["--kv-transfer-config", "{nope"]), /invalid JSON/);
    assert.throws(() => parseSimArgs(["--speed", "-1"]), /--speed/);
  });

  it("bin/infera-sim.js --help prints usage; a bad flag exits 2", () => {
    const help = spawnSync(process.execPath, ["bin/infera-sim.js", "--help"], { encoding: "utf8" });
    assert.equal(help.status, 0);
    assert.match(help.stdout, /--kv-events-config JSON/);
    const bad = spawnSync(process.execPath, ["bin/infera-sim.js", "--role", "x"], { encoding: "utf8" });
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /argument --role: invalid choice/);
  });
});
