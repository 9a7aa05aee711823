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
import { parseMetric } from "../../helpers/sim.ts";
import { bindable, EventTags, freePortBlock, replay, spawnFleet, waitUntil } from "./fleet-helpers.ts";

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

  it("KV events: a request to engine i is published on i's endpoint alone, and replayed there", async () => {
    const subs = fleet.engines.map((e) => new EventTags(e.kvEndpoint!));
    try {
      await new Promise((r) => setTimeout(r, 400)); // SUB sockets joined (ZMQ slow joiner)
      await complete(fleet.engines[2].url, `${LONG} engine two`);
      await waitUntil(() => subs[2].tags.includes("BlockStored"), 5000, "BlockStored on engine 2");
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
    const [http, kv, rp] = [await freePortBlock(3), await freePortBlock(6), await freePortBlock(6)];
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
    const [http, kv] = [await freePortBlock(4), await freePortBlock(4)];
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
    const kv = await freePortBlock(3);
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
