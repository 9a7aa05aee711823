/**
 * The sim's personalities on the KV-event wire and with data-parallel ranks: golden frames per
 * engine over a real ZMQ SUB, per-rank ports and pins, bind-or-connect. Expectations from the
 * engines' source (cited per test).
 */
import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import { parseSimArgs } from "../../../src/engine/sim/args.ts";
import { type SimHandle, startSimEngine } from "../../../src/engine/sim/server.ts";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric } from "../../helpers/sim.ts";
import { complete, firstBatch, PROMPT, runBin, unpackr } from "./personality-helpers.ts";

describe("personality KV-event frames over a real ZMQ SUB", () => {
  const sims: SimHandle[] = [];
  after(async () => {
    for (const s of sims) await s.close();
  });

  it("vLLM newest layout: map batch, map events with type, extra_keys per block, group_idx, kv_cache_spec_kind", async () => {
    const sim = await startSimEngine({
      // `--engine vllm` defaults to vLLM's newest (map) layout.
      argv: ["--engine", "vllm"],
      model: "v",
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      kvEvents: {
        enable_kv_cache_events: true,
        publisher: "zmq",
        endpoint: "tcp://127.0.0.1:*",
        topic: "kv",
      },
    });
    sims.push(sim);
    const frames = await firstBatch(sim, sim.kvEndpoint!, {
      model: "v",
      prompt: PROMPT,
      max_tokens: 1,
      cache_salt: "s1",
    });
    // vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34:
    // [topic, seq (8-byte BE), payload]; EventBatch/KVCacheEvent are tagged, omit_defaults maps.
    assert.equal(frames.length, 3);
    assert.equal(frames[0].toString(), "kv");
    assert.equal(frames[1].readBigUInt64BE(0), 0n);
    const batch = unpackr.unpack(frames[2]) as Record<string, unknown>;
    assert.deepEqual(Object.keys(batch), ["ts", "events", "data_parallel_rank"]);
    assert.equal(typeof batch.ts, "number");
    assert.equal(batch.data_parallel_rank, 0);
    const [ev] = batch.events as Record<string, unknown>[];
    const hashes = ev.block_hashes as unknown[];
    assert.equal(hashes.length, 2);
    // vllm/v1/core/block_pool.py: BlockStored(..., medium=MEDIUM_GPU, lora_name, extra_keys one
    // entry per block (kv_cache_utils.generate_block_hash_extra_keys: lora + mm + cache_salt on
    // the first block only), group_idx=kv_cache_group_id); kv_cache_spec_kind "full_attention".
    assert.deepEqual(ev, {
      type: "BlockStored",
      block_hashes: hashes,
      parent_block_hash: null,
      token_ids: PROMPT.slice(0, 32),
      block_size: 16,
      lora_id: null,
      medium: "GPU",
      lora_name: null,
      extra_keys: [["s1"], null],
      group_idx: 0,
      kv_cache_spec_kind: "full_attention",
    });
  });

  it("SGLang: positional arrays, one event per page, {cache_salt} after medium, batch third field attn_dp_rank", async () => {
    const sim = await startSimEngine({
      argv: ["--engine", "sglang", "--model-path", "sg", "--page-size", "16"],
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      kvEvents: { publisher: "zmq", endpoint: "tcp://127.0.0.1:*", topic: "" },
    });
    sims.push(sim);
    const frames = await firstBatch(sim, sim.kvEndpoint!, {
      model: "sg",
      prompt: PROMPT,
      max_tokens: 1,
      cache_salt: "salty",
    });
    // sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py @ 612d579090db24ec7c47cc5ca6b83e0c649b8c28:
    // EventBatch(array_like) [ts, events, attn_dp_rank]; BlockStored(array_like, tag)
    // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium];
    // BlockStoredWithMetadata(tag="BlockStored") appends metadata {cache_salt}.
    assert.equal(frames.length, 3);
    const batch = unpackr.unpack(frames[2]) as unknown[];
    assert.ok(Array.isArray(batch));
    assert.equal(batch.length, 3);
    assert.equal(batch[2], 0);
    const events = batch[1] as unknown[][];
    assert.equal(events.length, 2, "one BlockStored per page");
    const h0 = (events[0][1] as unknown[])[0];
    const h1 = (events[1][1] as unknown[])[0];
    assert.deepEqual(events, [
      ["BlockStored", [h0], null, PROMPT.slice(0, 16), 16, null, "GPU", { cache_salt: "salty" }],
      ["BlockStored", [h1], h0, PROMPT.slice(16, 32), 16, null, "GPU", { cache_salt: "salty" }],
    ]);
  });

  it("ATOM: [payload] frames when the topic is empty, omit_defaults arrays, no replay", async () => {
    const port = await freePort();
    const sim = await startSimEngine({
      argv: ["--engine", "atom", "--model", "at"],
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      kvEvents: {
        enable_kv_cache_events: true,
        publisher: "zmq",
        endpoint: `tcp://127.0.0.1:${port}`,
        topic: "",
      },
    });
    sims.push(sim);
    const frames = await firstBatch(sim, `tcp://127.0.0.1:${port}`, {
      model: "at",
      prompt: PROMPT,
      max_tokens: 1,
    });
    // ROCm/ATOM atom/distributed/kv_events.py @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21:
    // ZmqEventPublisher sends one frame (payload) when topic == "", else [topic, payload]; no seq;
    // BlockStored array_like + omit_defaults with medium "GPU" (default) → trailing fields dropped.
    assert.equal(frames.length, 1);
    const batch = unpackr.unpack(frames[0]) as unknown[];
    const [ev] = batch[1] as unknown[][];
    assert.deepEqual(ev, ["BlockStored", ev[1], null, PROMPT.slice(0, 32), 16]);
    assert.equal((ev[1] as unknown[]).length, 2);
    assert.equal(sim.replayEndpoint, null);
  });
});

describe("data parallel ranks in one process", () => {
  const sims: SimHandle[] = [];
  after(async () => {
    for (const s of sims) await s.close();
  });

  it("SGLang --dp-size 2: rank r publishes on port+r; routed_dp_rank pins the rank; metrics carry dp_rank", async () => {
    const base = await freePort();
    const sim = await startSimEngine({
      argv: ["--engine", "sglang", "--model-path", "sg", "--dp-size", "2", "--page-size", "16"],
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      // A wildcard host: SGLang binds only `*`, `::`, `0.0.0.0` (else it connects).
      kvEvents: { publisher: "zmq", endpoint: `tcp://*:${base}`, topic: "" },
    });
    sims.push(sim);
    assert.equal(sim.engines.length, 2);
    assert.deepEqual(
      sim.kvRanks.map((k) => k.endpoint),
      [`tcp://127.0.0.1:${base}`, `tcp://127.0.0.1:${base + 1}`],
    );
    // GenerateReqInput.routed_dp_rank (python/sglang/srt/managers/io_struct.py).
    const frames = await firstBatch(sim, `tcp://127.0.0.1:${base + 1}`, {
      model: "sg",
      prompt: PROMPT,
      max_tokens: 1,
      routed_dp_rank: 1,
    });
    const batch = unpackr.unpack(frames[2]) as unknown[];
    assert.equal(batch[2], 1, "attn_dp_rank of rank 1");
    const m = await (await fetch(`${sim.url}/metrics`)).text();
    assert.notEqual(parseMetric(m, "sglang:num_running_reqs", { dp_rank: "0" }), undefined);
    assert.notEqual(parseMetric(m, "sglang:num_running_reqs", { dp_rank: "1" }), undefined);
    assert.equal(parseMetric(m, "sglang:generation_tokens_total", { dp_rank: "1" }), 1);
  });

  it("vLLM -dp 2: X-data-parallel-rank pins the rank; an out-of-range rank is a 400", async () => {
    const sim = await startSimEngine({
      argv: ["--engine", "vllm", "-dp", "2"],
      model: "v",
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      kvEvents: { enable_kv_cache_events: true, publisher: "zmq", endpoint: "tcp://127.0.0.1:*", topic: "" },
    });
    sims.push(sim);
    assert.equal(sim.kvRanks.length, 2);
    const frames = await firstBatch(
      sim,
      sim.kvRanks[1].endpoint,
      { model: "v", prompt: PROMPT, max_tokens: 1 },
      { "X-data-parallel-rank": "1" },
    );
    assert.equal((unpackr.unpack(frames[2]) as Record<string, unknown>).data_parallel_rank, 1);
    const bad = await complete(
      sim.url,
      { model: "v", prompt: "x", max_tokens: 1 },
      { "X-data-parallel-rank": "5" },
    );
    assert.equal(bad.status, 400);
  });

  it("vLLM and SGLang connect (nobody can subscribe) when the endpoint host is not a wildcard; ATOM binds", async () => {
    // vllm-project/vllm vllm/distributed/kv_events.py _socket_setup @ 0181ea3173e53eea8cf04a86891488e3dc89bb34:
    // bind only if the endpoint has `*` or `::` (or is ipc/inproc), else connect().
    // sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py: also `0.0.0.0`.
    // ROCm/ATOM atom/distributed/kv_events.py @ ffdf3bb5: always bind.
    const { createConnection } = await import("node:net");
    const listening = (port: number): Promise<boolean> =>
      new Promise((resolve) => {
        const c = createConnection({ host: "127.0.0.1", port });
        c.once("connect", () => {
          c.destroy();
          resolve(true);
        });
        c.once("error", () => resolve(false));
      });
    for (const [argv, expect] of [
      [["--engine", "vllm"], false],
      [["--engine", "sglang", "--model-path", "v"], false],
      [["--engine", "atom", "--model", "v"], true],
    ] as const) {
      const port = await freePort();
      const sim = await startSimEngine({
        argv: [...argv],
        model: "v",
        host: "127.0.0.1",
        port: 0,
        kvEvents: { enable_kv_cache_events: true, publisher: "zmq", endpoint: `tcp://127.0.0.1:${port}` },
      });
      sims.push(sim);
      assert.equal(await listening(port), expect, argv.join(" "));
    }
  });

  it("vLLM without --engine keeps the older positional layout by default", () => {
    assert.equal(parseSimArgs(["serve", "m"]).config.kvEventsEncoding, "array");
    assert.equal(parseSimArgs(["--engine", "vllm", "serve", "m"]).config.kvEventsEncoding, "map");
  });

  it("ATOM -dp 2 with KV events fails at start-up: every rank binds the same endpoint", async () => {
    const kvPort = await freePort();
    // ROCm/ATOM atom/distributed/kv_events.py ZmqEventPublisher binds `endpoint` as given (no DP
    // offset) and atom/model_engine/scheduler.py builds one per rank → the second bind fails.
    const r = runBin(["--engine", "atom", "--model", "at", "--server-port", "0", "-dp", "2"], {
      ATOM_KV_EVENTS_ENABLE: "1",
      ATOM_KV_EVENTS_ENDPOINT: `tcp://127.0.0.1:${kvPort}`,
    });
    assert.notEqual(r.status, 0);
    assert.match(String(r.stdout) + String(r.stderr), /Address already in use/);
  });
});
