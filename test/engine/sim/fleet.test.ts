/**
 * `--fleet N`: N engines in one process, each reachable on its own ports with its own metrics
 * and KV events; the manifest; a start failure releases the whole fleet. Real sockets.
 */
import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { dirname } from "node:path";
import { after, before, describe, it } from "node:test";
import { ArgParseError, parseSimArgs, SIM_HELP } from "../../../src/engine/sim/args.ts";
import { FleetStartError, type SimFleet, startSimFleet } from "../../../src/engine/sim/fleet.ts";
import { fleetKvTransferConfig } from "../../../src/engine/sim/fleet-ports.ts";
import { bindable, freePortRun } from "../../helpers/ports.ts";
import { kvEventsReceived, parseMetric } from "../../helpers/sim.ts";
import { EventTags, replay, spawnFleet, waitUntil } from "./fleet-helpers.ts";

const MODEL = "fleet-model";
const ANY_KV = JSON.stringify({
  enable_kv_cache_events: true,
  publisher: "zmq",
  endpoint: "tcp://127.0.0.1:*",
  replay_endpoint: "tcp://127.0.0.1:*",
  topic: "kv-events",
});
const baseArgs = (port: number | string, kv = ANY_KV) => [
  "serve",
  MODEL,
  "--host",
  "127.0.0.1",
  "--port",
  String(port),
  "--kv-events-config",
  kv,
  "--speed",
  "50",
];
const LONG = "A fleet engine keeps its own KV cache, scheduler and event stream. ".repeat(8);

async function complete(url: string, prompt = LONG, maxTokens = 5): Promise<void> {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: maxTokens }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
}

async function metrics(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`)).text();
}

describe("sim fleet in one process", () => {
  let fleet: SimFleet;
  before(async () => {
    fleet = await startSimFleet({ count: 6, argv: baseArgs(0) });
  });
  after(async () => {
    await fleet?.close();
  });

  it("every engine answers on its own port, with its own engine id", async () => {
    const urls = fleet.engines.map((e) => e.url);
    assert.equal(new Set(urls).size, 6);
    for (const url of urls) {
      const r = await fetch(`${url}/v1/models`);
      assert.equal(r.status, 200);
      const body = (await r.json()) as { data: { id: string }[] };
      assert.deepEqual(
        body.data.map((m) => m.id),
        [MODEL],
      );
    }
    assert.equal(new Set(fleet.engines.map((e) => e.kvHost.engineId)).size, 6);
  });

  it("a request to one engine shows in that engine's /metrics only", async () => {
    await complete(fleet.engines[3].url, "metrics are per engine", 5);
    const texts = await Promise.all(fleet.engines.map((e) => metrics(e.url)));
    texts.forEach((t, i) => {
      const labels = { model_name: MODEL, engine: "0" };
      assert.equal(parseMetric(t, "vllm:generation_tokens_total", labels), i === 3 ? 5 : 0, `engine ${i}`);
      assert.equal(
        parseMetric(t, "vllm:request_success_total", { finished_reason: "length" }) ?? 0,
        i === 3 ? 1 : 0,
        `engine ${i}`,
      );
    });
  });

  it("steps delayed by a busy event loop count as late (the box, not the model, set the pace)", async () => {
    const e = fleet.engines[5].engine;
    const before = e.lateSteps;
    const r = fetch(`${fleet.engines[5].url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, prompt: "late steps", max_tokens: 1500 }),
    }).then((x) => x.text());
    const s0 = e.steps;
    const deadline = Date.now() + 5000;
    while (e.steps < s0 + 3) {
      assert.ok(Date.now() < deadline, "engine 5 stepping");
      await new Promise((r) => setImmediate(r));
    }
    for (let k = 0; k < 3; k++) {
      const until = performance.now() + 40;
      while (performance.now() < until) {
        // a CPU-bound stretch: every engine's next step waits for it
      }
      await new Promise((r) => setImmediate(r));
    }
    await r;
    assert.ok(e.lateSteps - before >= 1, `late steps ${e.lateSteps - before}`);
    assert.ok(e.lateMs > 0);
  });

  it("KV events: a request to engine i is published on i's endpoint alone, and replayed there", async () => {
    const subs = fleet.engines.map((e) => new EventTags(e.kvEndpoint!));
    try {
      // Engine 2 is asked until its SUB here has seen a BlockStored, each time after a reset of its
      // cache so that the blocks are stored (published) again: a fixed sleep for the SUB to join
      // (ZMQ's slow joiner) is too short on a loaded box.
      await kvEventsReceived({ url: fleet.engines[2].url, model: MODEL }, () =>
        subs[2].tags.includes("BlockStored"),
      );
      await new Promise((r) => setTimeout(r, 300));
      subs.forEach((s, i) => {
        if (i !== 2) assert.deepEqual(s.tags, [], `engine ${i} published nothing`);
      });
      // vLLM's replay ROUTER: [identity, "", start_seq] → [identity, "", seq, payload]…, then seq -1
      // (vllm-project/vllm vllm/distributed/kv_events.py _service_replay
      // @ 0181ea3173e53eea8cf04a86891488e3dc89bb34).
      const mine = await replay(fleet.engines[2].replayEndpoint!);
      assert.ok(mine.length >= 1);
      assert.equal(mine[0].seq, 0n);
      assert.ok(mine.some((b) => b.tags.includes("BlockStored")));
      assert.deepEqual(await replay(fleet.engines[4].replayEndpoint!), []);
    } finally {
      for (const s of subs) s.close();
    }
  });
});

describe("sim fleet ports", () => {
  it("engine i: HTTP --port + i; KV-event and replay ports + i x dp size, then + rank", async () => {
    const [http, kv, rp] = [await freePortRun(3), await freePortRun(6), await freePortRun(6)];
    const cfg = JSON.stringify({
      enable_kv_cache_events: true,
      publisher: "zmq",
      endpoint: `tcp://127.0.0.1:${kv}`,
      replay_endpoint: `tcp://127.0.0.1:${rp}`,
    });
    const fleet = await startSimFleet({ count: 3, argv: [...baseArgs(http, cfg), "-dp", "2"] });
    try {
      fleet.engines.forEach((e, i) => {
        assert.equal(e.port, http + i);
        // Within an engine, each DP rank's ports are the engine's base + rank, as vLLM's
        // offset_endpoint_port does (vllm-project/vllm vllm/distributed/kv_events.py
        // @ 0181ea3173e53eea8cf04a86891488e3dc89bb34); the engine's base is ours: + i x dp size.
        assert.deepEqual(e.kvRanks, [
          {
            rank: 0,
            endpoint: `tcp://127.0.0.1:${kv + 2 * i}`,
            replayEndpoint: `tcp://127.0.0.1:${rp + 2 * i}`,
          },
          {
            rank: 1,
            endpoint: `tcp://127.0.0.1:${kv + 2 * i + 1}`,
            replayEndpoint: `tcp://127.0.0.1:${rp + 2 * i + 1}`,
          },
        ]);
      });
    } finally {
      await fleet.close();
    }
  });

  it("a port in use fails the whole fleet, naming the engine and port, and releases every engine", async () => {
    const [http, kv] = [await freePortRun(4), await freePortRun(4)];
    const squatter: Server = createServer();
    await new Promise<void>((r) => squatter.listen(http + 2, "127.0.0.1", r));
    try {
      const cfg = JSON.stringify({ endpoint: `tcp://127.0.0.1:${kv}`, publisher: "zmq" });
      const err = await startSimFleet({ count: 4, argv: baseArgs(http, cfg) }).then(
        () => assert.fail("the fleet must not start"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof FleetStartError, String(err));
      assert.equal(err.index, 2);
      assert.equal(err.port, http + 2);
      assert.match(err.message, new RegExp(`fleet engine 2 \\(HTTP port ${http + 2}`));
      assert.match(err.message, /EADDRINUSE/);
    } finally {
      squatter.close();
    }
    // Nothing of the fleet is left bound: every other engine's HTTP and KV ports are free.
    for (const p of [http, http + 1, http + 3]) assert.ok(await bindable(p), `HTTP port ${p} released`);
    for (let k = 0; k < 4; k++) await waitUntil(() => bindable(kv + k), 3000, `KV port ${kv + k} released`);
  });
});

describe("infera-sim --fleet (process)", () => {
  it("writes the manifest once all engines are up; every engine answers; SIGTERM closes all", async () => {
    const f = await spawnFleet(3, baseArgs(0));
    const stopped = { done: false };
    try {
      const m = f.manifest;
      assert.equal(m.pid, f.proc.pid);
      assert.deepEqual(
        m.engines.map((e) => e.index),
        [0, 1, 2],
      );
      for (const e of m.engines) {
        assert.equal(e.url, `http://127.0.0.1:${e.port}`);
        assert.equal(e.kvRanks.length, 1);
        assert.equal(e.kvRanks[0].rank, 0);
        assert.match(e.kvRanks[0].endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/);
        assert.match(e.kvRanks[0].replayEndpoint ?? "", /^tcp:\/\/127\.0\.0\.1:\d+$/);
        assert.equal((await fetch(`${e.url}/health`)).status, 200);
      }
      assert.equal(new Set(m.engines.map((e) => e.port)).size, 3);
      // Written by rename: no temporary file is left beside it.
      const dir = dirname(
        f.proc.spawnargs[f.proc.spawnargs.indexOf("--fleet-manifest") + 1] ?? "/nonexistent",
      );
      assert.deepEqual(readdirSync(dir), ["manifest.json"]);
      const ready = f
        .output()
        .split("\n")
        .find((l) => l.includes('"fleet ready"'));
      assert.ok(ready, f.output());
      const line = JSON.parse(ready) as { count: number; rssMiB: number };
      assert.equal(line.count, 3);
      assert.ok(line.rssMiB > 0);
      assert.equal(await f.stop(), 0);
      stopped.done = true;
      for (const e of m.engines) await assert.rejects(fetch(`${e.url}/health`));
    } finally {
      if (!stopped.done) await f.stop();
    }
  });

  it("a port in use: exit 1, the error names the engine and the port", async () => {
    const kv = await freePortRun(3);
    const squatter: Server = createServer();
    await new Promise<void>((r) => squatter.listen(kv + 1, "127.0.0.1", r));
    try {
      const cfg = JSON.stringify({ endpoint: `tcp://127.0.0.1:${kv}`, publisher: "zmq" });
      await assert.rejects(spawnFleet(3, baseArgs(0, cfg)), (e: Error) => {
        assert.match(e.message, /exited \(1\)/);
        assert.match(e.message, /fleet engine 1 /);
        assert.ok(e.message.includes(`tcp://127.0.0.1:${kv + 1}`), e.message);
        return true;
      });
    } finally {
      squatter.close();
    }
  });
});

describe("fleets of every personality", () => {
  it("SGLang: engine i's bootstrap server on --disaggregation-bootstrap-port + i", async () => {
    const b = await freePortRun(3);
    const fleet = await startSimFleet({
      count: 3,
      argv: [
        ...["--engine", "sglang", "--model-path", MODEL, "--host", "127.0.0.1", "--port", "0"],
        ...["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", String(b)],
      ],
    });
    try {
      // SGLang's bootstrap server answers GET /health "OK" (sgl-project/sglang
      // python/sglang/srt/disaggregation/common/conn.py @ 0094505da74125a31ceb354f37ae7a1b6a97d3f5).
      for (let i = 0; i < 3; i++) {
        const r = await fetch(`http://127.0.0.1:${b + i}/health`);
        assert.equal(await r.text(), "OK");
        assert.equal(fleet.engines[i].connector?.describe?.().bootstrapPort, b + i);
      }
    } finally {
      await fleet.close();
    }
  });

  it("ATOM: engine i's handshake port (and /kv_transfer_info) is the configured one + i", async () => {
    const h = await freePortRun(2);
    const fleet = await startSimFleet({
      count: 2,
      argv: [
        ...["--engine", "atom", "--model", MODEL, "--host", "127.0.0.1", "--server-port", "0"],
        "--kv-transfer-config",
        JSON.stringify({ kv_role: "kv_producer", kv_connector: "mooncake", handshake_port: h }),
      ],
    });
    try {
      for (let i = 0; i < 2; i++) {
        // ROCm/ATOM atom/entrypoints/openai/api_server.py @ 003e55685b43743ee1a6d53c9faebe1039808f8b
        // kv_transfer_info: {tp_size, dp_size, kv_role, handshake_port} from the kv-transfer config.
        const info = (await (await fetch(`${fleet.engines[i].url}/kv_transfer_info`)).json()) as Record<
          string,
          unknown
        >;
        assert.deepEqual(info, { tp_size: 1, dp_size: 1, kv_role: "kv_producer", handshake_port: h + i });
        assert.equal(fleet.engines[i].connector?.describe?.().handshakePort, h + i);
      }
    } finally {
      await fleet.close();
    }
  });
});

describe("fleet PD ports (fleetKvTransferConfig)", () => {
  // Our convention: engine i's fixed PD ports are the configured base + i x dp size, found where
  // the connector finds them (config, extra config, env, default); 0 = any free port stays 0.
  it("moves each connector's fixed ports to engine i's block, wherever the base came from", () => {
    assert.deepEqual(
      fleetKvTransferConfig("nixl", { kv_connector_extra_config: { side_channel_port: 7000 } }, 3, 2),
      {
        kv_connector_extra_config: { side_channel_port: 7006 },
      },
    );
    assert.deepEqual(fleetKvTransferConfig("nixl", {}, 2, 1, { VLLM_NIXL_SIDE_CHANNEL_PORT: "9000" }), {
      side_channel_port: 9002,
    });
    assert.deepEqual(fleetKvTransferConfig("nixl", {}, 2, 1, {}), { side_channel_port: 5602 });
    assert.deepEqual(fleetKvTransferConfig("nixl", { side_channel_port: 0 }, 5, 1, {}), {
      side_channel_port: 0,
    });
    assert.deepEqual(fleetKvTransferConfig("mooncake", { bootstrap_port: 8000 }, 1, 1, {}), {
      bootstrap_port: 8001,
    });
    assert.deepEqual(fleetKvTransferConfig("sglang", {}, 4, 1, {}), { bootstrap_port: 9002 });
    assert.deepEqual(fleetKvTransferConfig("atom", { handshake_port: 6301 }, 1, 4, {}), {
      handshake_port: 6305,
    });
    // MoRIIO: http_port names the engine's own HTTP port, which moves by i (not i x dp size).
    assert.deepEqual(
      fleetKvTransferConfig(
        "moriio",
        { kv_connector_extra_config: { proxy_ip: "h", proxy_ping_port: 1, http_port: 8100, notify_port: 0 } },
        2,
        2,
        {},
      ),
      {
        handshake_port: 6305,
        kv_connector_extra_config: { proxy_ip: "h", proxy_ping_port: 1, http_port: 8102, notify_port: 0 },
      },
    );
    const untouched = { kv_connector_extra_config: { side_channel_port: 7000 } };
    assert.equal(fleetKvTransferConfig("nixl", untouched, 0, 1), untouched);
  });
});

describe("--fleet flags", () => {
  it("are sim-only flags of every personality, listed in --help", () => {
    assert.deepEqual(parseSimArgs(["serve", "m", "--fleet", "4"]).fleet, { count: 4, manifest: null });
    assert.deepEqual(parseSimArgs(["--engine", "sglang", "--model-path", "m", "--fleet=2"]).fleet, {
      count: 2,
      manifest: null,
    });
    assert.deepEqual(
      parseSimArgs(["--engine", "atom", "--model", "m", "--fleet", "3", "--fleet-manifest", "/tmp/x"]).fleet,
      { count: 3, manifest: "/tmp/x" },
    );
    assert.equal(parseSimArgs(["serve", "m"]).fleet, null);
    assert.throws(() => parseSimArgs(["serve", "m", "--fleet", "0"]), ArgParseError);
    assert.match(SIM_HELP, /--fleet N/);
    assert.match(SIM_HELP, /--fleet-manifest FILE/);
  });
});
