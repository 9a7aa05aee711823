/**
 * KV-event sockets the launcher hands each engine, and the per-rank record.
 *
 * vLLM: vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34
 * (`ZmqEventPublisher`): rank r's endpoint and replay_endpoint are `offset_endpoint_port(…, r)`
 * = port + r; the PUB socket bind()s only when the endpoint contains `*` or `::` (else it
 * connect()s — 0.0.0.0 or a specific IP included); the replay ROUTER always bind()s.
 * SGLang: sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py @
 * 006d053f182f9b488d2bd841afa06d5f9120a258 — the same bind/connect rule and offset, by
 * `attn_dp_rank` (python/sglang/srt/managers/scheduler_metrics_mixin.py @ 78ac30c2056f2c25089c1d3203c3d5c13dc3d946
 * `init_kv_events`), which `compute_dp_attention_world_info` (python/sglang/srt/layers/dp_attention.py)
 * sets to 0 on every replica unless --enable-dp-attention.
 * ATOM: ROCm/ATOM atom/distributed/kv_events.py @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21 —
 * `ZmqEventPublisher` bind()s ATOM_KV_EVENTS_ENDPOINT as given, with no per-rank offset
 * (atom/model_engine/scheduler.py passes the same endpoint to every DP rank).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { build, json } from "./build.ts";

describe("KV events: the engine gets a wildcard bind, the record the reachable host", () => {
  for (const engine of ["vllm", "sglang"] as const) {
    it(`${engine}: tcp://*:PORT to the engine whatever --host is (a specific IP would connect())`, async () => {
      for (const host of ["0.0.0.0", "10.0.0.5", "127.0.0.1", "::"]) {
        const { cmd, record } = await build(engine, { host, advertiseHost: "10.0.0.5" });
        const cfg = json(cmd.argv, "--kv-events-config");
        assert.equal(cfg?.endpoint, "tcp://*:5557", host);
        assert.equal(cfg?.replay_endpoint, "tcp://*:5558", host);
        assert.equal(record.kvEvents?.endpoint, "tcp://10.0.0.5:5557", host);
        assert.equal(record.kvEvents?.replayEndpoint, "tcp://10.0.0.5:5558", host);
      }
    });
  }

  it("an IPv6 advertise host is bracketed in the record's ZMQ endpoints", async () => {
    const { record } = await build("vllm", { advertiseHost: "fd00::5" });
    assert.equal(record.kvEvents?.endpoint, "tcp://[fd00::5]:5557");
  });
});

describe("KV events with data parallelism", () => {
  for (const dp of [2, 4]) {
    it(`vllm --dp ${dp}: replay base moves past the PUB range; one record entry per rank`, async () => {
      const { cmd, record } = await build("vllm", { dp: String(dp) });
      const cfg = json(cmd.argv, "--kv-events-config");
      // Rank 0's endpoints; vLLM adds r itself. Old defaults (5557/5558) put rank 1's PUB on rank 0's replay.
      assert.equal(cfg?.endpoint, "tcp://*:5557");
      assert.equal(cfg?.replay_endpoint, `tcp://*:${5557 + dp}`);
      const ranks = record.kvEvents?.ranks ?? [];
      assert.equal(ranks.length, dp);
      const ports = new Set<string>();
      for (const [r, rank] of ranks.entries()) {
        assert.equal(rank.dpRank, r);
        assert.equal(rank.endpoint, `tcp://10.0.0.5:${5557 + r}`);
        assert.equal(rank.replayEndpoint, `tcp://10.0.0.5:${5557 + dp + r}`);
        ports.add(rank.endpoint).add(rank.replayEndpoint as string);
      }
      assert.equal(ports.size, 2 * dp, "no two sockets share a port");
      assert.equal(record.kvEvents?.endpoint, ranks[0]?.endpoint);
      assert.equal(record.kvEvents?.replayEndpoint, ranks[0]?.replayEndpoint);
      // --dp 1 keeps the engines' defaults 5557/5558 and a single endpoint.
      const one = await build("vllm");
      assert.equal(json(one.cmd.argv, "--kv-events-config")?.replay_endpoint, "tcp://*:5558");
      assert.equal(one.record.kvEvents?.ranks, undefined);
    });
  }

  it("explicit ports: accepted when the ranges are apart, refused when rank sockets would collide", async () => {
    const ok = await build("vllm", { dp: "2", kvEventsPort: "6000", kvEventsReplayPort: "6002" });
    assert.deepEqual(
      ok.record.kvEvents?.ranks?.map((r) => [r.endpoint, r.replayEndpoint]),
      [
        ["tcp://10.0.0.5:6000", "tcp://10.0.0.5:6002"],
        ["tcp://10.0.0.5:6001", "tcp://10.0.0.5:6003"],
      ],
    );
    await assert.rejects(
      build("vllm", { dp: "2", kvEventsPort: "5557", kvEventsReplayPort: "5558" }),
      /KV-event ports collide/,
    );
    await assert.rejects(
      build("sglang", { dp: "3", kvEventsPort: "7002", kvEventsReplayPort: "7000" }, [
        "--enable-dp-attention",
      ]),
      /KV-event ports collide/,
    );
    await assert.rejects(build("vllm", { dp: "4", kvEventsPort: "65534" }), /past 65535/);
    // Nothing binds with events off.
    await build("vllm", { dp: "2", kvEvents: false, kvEventsPort: "5557", kvEventsReplayPort: "5558" });
  });

  it("sglang --dp 2 with --enable-dp-attention: per-rank record; plain --dp with events is refused", async () => {
    const { cmd, record } = await build("sglang", { dp: "2", tp: "2" }, ["--enable-dp-attention"]);
    assert.equal(json(cmd.argv, "--kv-events-config")?.replay_endpoint, "tcp://*:5559");
    assert.deepEqual(record.kvEvents?.ranks, [
      { dpRank: 0, endpoint: "tcp://10.0.0.5:5557", replayEndpoint: "tcp://10.0.0.5:5559" },
      { dpRank: 1, endpoint: "tcp://10.0.0.5:5558", replayEndpoint: "tcp://10.0.0.5:5560" },
    ]);
    await assert.rejects(build("sglang", { dp: "2" }), /--enable-dp-attention/);
    const off = await build("sglang", { dp: "2", kvEvents: false });
    assert.equal(off.record.kvEvents, undefined);
  });

  it("atom --dp 2: every rank would bind the one endpoint, so events must be off", async () => {
    await assert.rejects(build("atom", { dp: "2" }), /--no-kv-events/);
    // ATOM always bind()s: a specific host is kept, 0.0.0.0 becomes *.
    assert.equal(
      (await build("atom", { host: "10.0.0.5" })).cmd.env.ATOM_KV_EVENTS_ENDPOINT,
      "tcp://10.0.0.5:5557",
    );
    assert.equal((await build("atom", { host: "0.0.0.0" })).cmd.env.ATOM_KV_EVENTS_ENDPOINT, "tcp://*:5557");
    const { cmd, record } = await build("atom", { dp: "2", kvEvents: false });
    assert.equal(cmd.env.ATOM_KV_EVENTS_ENABLE, undefined);
    assert.equal(record.kvEvents, undefined);
  });
});
