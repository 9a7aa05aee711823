/**
 * The sim's engine personalities (`--engine vllm|sglang|atom`): each engine's own command line,
 * metric names, KV-event wire layout, DP ranks and native routes. Expectations come from the
 * engines' source (cited per test), not from the sim.
 */
import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import { parseSimArgs } from "../../../src/engine/sim/args.ts";
import { type SimHandle, startSimEngine } from "../../../src/engine/sim/server.ts";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric, startSim } from "../../helpers/sim.ts";
import { complete, PROMPT, runBin, Sub, unpackr } from "./personality-helpers.ts";

describe("personality command lines", () => {
  it("each personality parses its engine's own flag names", () => {
    // sgl-project/sglang python/sglang/srt/server_args.py: model_path (--model-path), port, tp_size
    // (--tp-size), dp_size (--dp-size), page_size, context_length, served_model_name,
    // disaggregation_mode / _bootstrap_port / _transfer_backend, enable_metrics.
    const s = parseSimArgs([
      "--engine",
      "sglang",
      "--model-path",
      "org/M",
      "--port",
      "30001",
      "--tp-size",
      "2",
      "--dp-size",
      "2",
      "--page-size",
      "32",
      "--context-length",
      "8192",
      "--served-model-name",
      "m",
      "--disaggregation-mode",
      "decode",
      "--disaggregation-bootstrap-port",
      "9100",
      "--disaggregation-transfer-backend",
      "mooncake",
      "--enable-metrics",
      "--kv-events-config",
      '{"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv"}',
    ]).config;
    assert.equal(s.engine, "sglang");
    assert.equal(s.model, "org/M");
    assert.deepEqual(s.servedModelNames, ["m"]);
    assert.equal(s.port, 30001);
    assert.equal(s.tpSize, 2);
    assert.equal(s.dpSize, 2);
    assert.equal(s.blockSize, 32);
    assert.equal(s.maxModelLen, 8192);
    assert.equal(s.role, "decode");
    assert.equal(s.connector, "sglang");
    assert.equal(s.kvTransferConfig.bootstrap_port, 9100);
    assert.equal(s.kvEvents?.topic, "kv");

    // ROCm/ATOM atom/model_engine/arg_utils.py + atom/entrypoints/openai/api_server.py
    // @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21: --model, --server-port (HTTP; --port is the
    // engine's internal port), -tp, -dp, --kv_cache_dtype, --block-size, --kv-transfer-config.
    const a = parseSimArgs(
      [
        "--engine",
        "atom",
        "--model",
        "org/A",
        "--server-port",
        "8123",
        "--port",
        "8006",
        "-tp",
        "4",
        "--kv_cache_dtype",
        "fp8",
        "--block-size",
        "16",
        "--kv-transfer-config",
        '{"kv_role":"kv_producer","kv_connector":"moriio","handshake_port":6301}',
      ],
      // atom/utils/envs.py: KV events are env-only.
      {
        ATOM_KV_EVENTS_ENABLE: "1",
        ATOM_KV_EVENTS_ENDPOINT: "tcp://127.0.0.1:6000",
        ATOM_KV_EVENTS_TOPIC: "t",
      },
    ).config;
    assert.equal(a.engine, "atom");
    assert.equal(a.port, 8123);
    assert.equal(a.tpSize, 4);
    assert.equal(a.role, "prefill");
    assert.equal(a.connector, "atom");
    assert.equal(a.kvEvents?.endpoint, "tcp://127.0.0.1:6000");
    assert.equal(a.kvEvents?.topic, "t");
    assert.equal(a.kvEventsFraming, "atom");
    // ATOM without the env var has no KV events (no CLI flag for them).
    assert.equal(parseSimArgs(["--engine", "atom", "--model", "x"], {}).config.kvEvents, null);
  });

  it("an unknown flag exits 2 with argparse's 'unrecognized arguments' in every personality", () => {
    // vLLM does not declare --model-path (SGLang's spelling); SGLang does not declare
    // --tensor-parallel-size's short -tp; ATOM does not declare --tp-size.
    const cases: [string[], string][] = [
      [["--engine", "vllm", "serve", "m", "--model-path", "x"], "unrecognized arguments: --model-path x"],
      [["--engine", "sglang", "--model-path", "m", "-tp", "2"], "unrecognized arguments: -tp 2"],
      [["--engine", "atom", "--model", "m", "--tp-size", "2"], "unrecognized arguments: --tp-size 2"],
      [["serve", "m", "--not-a-vllm-flag"], "unrecognized arguments: --not-a-vllm-flag"],
    ];
    for (const [args, msg] of cases) {
      const r = runBin(args);
      assert.equal(r.status, 2, `${args.join(" ")}: ${r.stderr}`);
      assert.match(String(r.stderr), /error: /);
      assert.ok(String(r.stderr).includes(msg), `${args.join(" ")} → ${r.stderr}`);
    }
    // Sim-only tuning flags are accepted everywhere.
    for (const engine of ["vllm", "sglang", "atom"]) {
      assert.doesNotThrow(() =>
        parseSimArgs(["--engine", engine, "--speed", "5", "--num-gpu-blocks", "100", "--seed", "1"]),
      );
    }
  });
});

describe("personality metrics", () => {
  const sims: SimHandle[] = [];
  after(async () => {
    for (const s of sims) await s.close();
  });

  it("SGLang serves sglang:* with its scheduler labels and the PD backlog gauges", async () => {
    const sim = await startSimEngine({
      argv: ["--engine", "sglang", "--model-path", "sg"],
      host: "127.0.0.1",
      port: 0,
      speed: 100,
    });
    sims.push(sim);
    const r = await complete(sim.url, { model: "sg", prompt: PROMPT, max_tokens: 3 });
    assert.equal(r.status, 200);
    await r.text();
    const m = await (await fetch(`${sim.url}/metrics`)).text();
    // python/sglang/srt/observability/metrics_collector.py (SchedulerMetricsCollector): labels
    // model_name, engine_type ("unified" when not disaggregated), tp_rank, pp_rank, moe_ep_rank.
    const labels = { model_name: "sg", engine_type: "unified", tp_rank: "0", pp_rank: "0", moe_ep_rank: "0" };
    for (const name of [
      "sglang:num_running_reqs",
      "sglang:num_queue_reqs",
      "sglang:token_usage",
      "sglang:cache_hit_rate",
      "sglang:num_prefill_prealloc_queue_reqs",
      "sglang:num_prefill_inflight_queue_reqs",
      "sglang:num_decode_prealloc_queue_reqs",
      "sglang:num_decode_transfer_queue_reqs",
      "sglang:time_to_first_token_seconds_count",
      "sglang:inter_token_latency_seconds_count",
      "sglang:e2e_request_latency_seconds_count",
    ])
      assert.notEqual(parseMetric(m, name, labels), undefined, name);
    assert.equal(parseMetric(m, "sglang:generation_tokens_total", labels), 3);
    assert.ok(!m.includes("vllm:"), "no vLLM names under SGLang");
  });

  it("ATOM serves atom:* unlabelled; vLLM no longer serves the retired gpu_cache_usage_perc", async () => {
    const sim = await startSimEngine({
      argv: ["--engine", "atom", "--model", "at"],
      host: "127.0.0.1",
      port: 0,
      speed: 100,
    });
    sims.push(sim);
    const r = await complete(sim.url, { model: "at", prompt: PROMPT, max_tokens: 2 });
    assert.equal(r.status, 200);
    await r.text();
    const m = await (await fetch(`${sim.url}/metrics`)).text();
    // ROCm/ATOM atom/entrypoints/openai/metrics.py @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21
    for (const name of [
      "atom:requests_running",
      "atom:requests_waiting",
      "atom:kv_cache_usage_ratio",
      "atom:kv_cache_blocks_total",
      "atom:metrics_snapshot_available",
    ])
      assert.notEqual(parseMetric(m, name), undefined, name);
    assert.equal(parseMetric(m, "atom:generation_tokens_total"), 2);
    assert.ok(!m.includes("vllm:") && !m.includes("sglang:"));
    assert.ok(/^atom:requests_running \d/m.test(m), "ATOM's gauges carry no labels");
  });
});

describe("personality routes", () => {
  const sims: SimHandle[] = [];
  after(async () => {
    for (const s of sims) await s.close();
  });

  it("SGLang POST /generate (text or input_ids, sampling_params, stream), /get_server_info, /get_model_info", async () => {
    const sim = await startSimEngine({
      argv: ["--engine", "sglang", "--model-path", "sg"],
      host: "127.0.0.1",
      port: 0,
      speed: 100,
    });
    sims.push(sim);
    // python/sglang/srt/entrypoints/http_server.py generate_request; GenerateReqInput fields.
    const r = await fetch(`${sim.url}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ text: "Hello there", sampling_params: { max_new_tokens: 4, temperature: 0 } }),
    });
    assert.equal(r.status, 200);
    const j = (await r.json()) as { text: string; meta_info: Record<string, unknown> };
    assert.equal(typeof j.text, "string");
    assert.equal(j.meta_info.completion_tokens, 4);
    assert.deepEqual(j.meta_info.finish_reason, { type: "length", length: 4 });

    const s = await fetch(`${sim.url}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ input_ids: PROMPT, sampling_params: { max_new_tokens: 3 }, stream: true }),
    });
    const text = await s.text();
    const data = text
      .split("\n\n")
      .filter((l) => l.startsWith("data: "))
      .map((l) => l.slice(6));
    assert.equal(data.at(-1), "[DONE]");
    const last = JSON.parse(data.at(-2)!) as { meta_info: Record<string, unknown> };
    assert.equal(last.meta_info.completion_tokens, 3);
    assert.equal(last.meta_info.prompt_tokens, PROMPT.length);

    const info = (await (await fetch(`${sim.url}/get_server_info`)).json()) as Record<string, unknown>;
    assert.equal(info.model_path, "sg");
    const mi = (await (await fetch(`${sim.url}/get_model_info`)).json()) as Record<string, unknown>;
    assert.equal(mi.is_generation, true);
  });

  it("ATOM answers 400 {detail} to another model name and serves /server_info, /kv_transfer_info", async () => {
    const sim = await startSimEngine({
      argv: [
        "--engine",
        "atom",
        "--model",
        "org/at",
        "-tp",
        "2",
        "--kv-transfer-config",
        '{"kv_role":"kv_consumer","handshake_port":6400}',
      ],
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      connectorFactory: () => null,
    });
    sims.push(sim);
    // atom/entrypoints/openai/api_server.py validate_model → HTTPException(400, detail=...).
    const r = await fetch(`${sim.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "other", messages: [{ role: "user", content: "hi" }], max_tokens: 1 }),
    });
    assert.equal(r.status, 400);
    assert.deepEqual(await r.json(), {
      detail: "Requested model 'other' does not match server model 'org/at'",
    });
    const ok = await complete(sim.url, { model: "org/at/", prompt: "hi", max_tokens: 1 });
    assert.equal(ok.status, 200, "a trailing / is ignored");
    await ok.text();
    assert.deepEqual(await (await fetch(`${sim.url}/server_info`)).json(), {
      model_id: "org/at",
      served_model_name: "org/at",
      tp_size: 2,
      dp_size: 1,
    });
    assert.deepEqual(await (await fetch(`${sim.url}/kv_transfer_info`)).json(), {
      tp_size: 2,
      dp_size: 1,
      kv_role: "kv_consumer",
      handshake_port: 6400,
    });
    assert.deepEqual(await (await fetch(`${sim.url}/health`)).json(), { status: "ok" });
    // Other bad requests: ATOM's handlers re-raise a ValueError as HTTPException(400, detail=str(e)).
    const bad = await complete(sim.url, { model: "org/at", max_tokens: 1 });
    assert.equal(bad.status, 400);
    const badBody = (await bad.json()) as Record<string, unknown>;
    assert.deepEqual(Object.keys(badBody), ["detail"]);
    assert.equal(typeof badBody.detail, "string");
  });

  it("vLLM still answers 404 model_not_found for an unknown model", async () => {
    const sim = await startSimEngine({ model: "v", host: "127.0.0.1", port: 0, speed: 100 });
    sims.push(sim);
    const r = await complete(sim.url, { model: "other", prompt: "x", max_tokens: 1 });
    assert.equal(r.status, 404);
    await r.text();
  });
});

describe("personalities as child processes (test/helpers/sim.ts)", () => {
  it("ATOM from its own command line and ATOM_KV_EVENTS_* env: [topic, payload] frames", async () => {
    const sim = await startSim({ engine: "atom", model: "at", args: ["--speed", "100"] });
    const sub = new Sub(sim.kvEndpoint);
    try {
      await new Promise((r) => setTimeout(r, 300));
      const r = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "at", prompt: PROMPT, max_tokens: 1 }),
      });
      assert.equal(r.status, 200);
      await r.text();
      // ROCm/ATOM atom/distributed/kv_events.py: a non-empty topic gives [topic, payload].
      const frames = await sub.first();
      assert.equal(frames.length, 2);
      assert.equal(frames[0].toString(), "kv-events");
      assert.ok(Array.isArray(unpackr.unpack(frames[1])));
      assert.notEqual(parseMetric(await sim.metrics(), "atom:requests_running"), undefined);
    } finally {
      sub.close();
      await sim.stop();
    }
  });
});

describe("SGLang personality PD flags drive the bootstrap connector", () => {
  it("--disaggregation-mode prefill/decode + --disaggregation-bootstrap-port: D answers, computing only the last prompt token", async () => {
    // python/sglang/srt/server_args.py: disaggregation_mode (null|prefill|decode),
    // disaggregation_bootstrap_port (8998); the router sends the identical body with
    // bootstrap_host/port/room to both.
    const port = await freePort();
    const common = ["--speed", "20", "--page-size", "16"];
    const [p, d] = await Promise.all([
      startSim({
        engine: "sglang",
        args: [
          ...common,
          "--disaggregation-mode",
          "prefill",
          "--disaggregation-bootstrap-port",
          String(port),
        ],
      }),
      startSim({ engine: "sglang", args: [...common, "--disaggregation-mode", "decode"] }),
    ]);
    try {
      const body = JSON.stringify({
        model: "sim-model",
        prompt: PROMPT,
        max_tokens: 4,
        bootstrap_host: "127.0.0.1",
        bootstrap_port: port,
        bootstrap_room: 42,
      });
      const post = (url: string) =>
        fetch(`${url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body,
        });
      const [pr, dr] = await Promise.all([post(p.url), post(d.url)]);
      assert.equal(pr.status, 200, await pr.clone().text());
      assert.equal(dr.status, 200, await dr.clone().text());
      await pr.text();
      const j = (await dr.json()) as { usage: { completion_tokens: number } };
      assert.equal(j.usage.completion_tokens, 4);
      const dm = await d.metrics();
      // SGLang labels its decode worker engine_type="decode" (DisaggregationMode.to_engine_type).
      assert.equal(parseMetric(dm, "sglang:generation_tokens_total", { engine_type: "decode" }), 4);
      assert.notEqual(
        parseMetric(await p.metrics(), "sglang:num_running_reqs", { engine_type: "prefill" }),
        undefined,
      );
    } finally {
      await Promise.all([p.stop(), d.stop()]);
    }
  });
});
