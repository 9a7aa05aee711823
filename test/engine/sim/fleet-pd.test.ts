/**
 * PD per engine of a fleet: a prefill fleet and a decode fleet (two `infera-sim --fleet 2`
 * processes), each engine registered as its own worker with a real `infera server` (static
 * discovery) in front. Every P engine serves its own side channel / bootstrap server on its
 * own port (the fixed base + engine index), and every D engine pulls from the P the router paired
 * it with. Connector internals are tested in test/engine/sim/pd; here: that they work per engine.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import type { PartialWorkerRecord } from "../../../src/discovery/static.ts";
import type { FleetManifest } from "../../../src/engine/sim/fleet.ts";
import { freePortRun } from "../../helpers/ports.ts";
import { parseMetric } from "../../helpers/sim.ts";
import { type FleetProcess, type ServerProcess, spawnFleet, startStaticServer } from "./fleet-helpers.ts";

const MODEL = "fleet-pd-model";
const KV = JSON.stringify({
  enable_kv_cache_events: true,
  publisher: "zmq",
  endpoint: "tcp://127.0.0.1:*",
  replay_endpoint: "tcp://127.0.0.1:*",
  topic: "kv-events",
});

type Kind = "nixl" | "sglang";

/** The connector config both fleets get, with P's fixed base port. */
function transferConfig(kind: Kind, role: "prefill" | "decode", base: number): Record<string, unknown> {
  if (kind === "nixl")
    return {
      kv_connector: "NixlConnector",
      kv_role: "kv_both",
      kv_connector_extra_config: { side_channel_port: base },
    };
  return {
    kv_connector: "sglang",
    kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
    bootstrap_port: base,
  };
}

function fleetArgs(kind: Kind, role: "prefill" | "decode", base: number): string[] {
  return [
    "serve",
    MODEL,
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--kv-events-config",
    KV,
    "--role",
    role,
    "--connector",
    kind,
    "--kv-transfer-config",
    JSON.stringify(transferConfig(kind, role, base)),
    "--speed",
    "20",
  ];
}

function records(
  m: FleetManifest,
  kind: Kind,
  role: "prefill" | "decode",
  base: number,
): PartialWorkerRecord[] {
  return m.engines.map((e) => ({
    id: `${role}-${e.index}`,
    url: e.url,
    model: MODEL,
    servedModelNames: [MODEL],
    engine: "sim",
    role,
    // P engine i's side channel / bootstrap server: base + i (dp size 1), the fleet's rule.
    connector:
      role === "prefill"
        ? { kind, bootstrapHost: "127.0.0.1", bootstrapPort: base + e.index }
        : { kind, bootstrapHost: "127.0.0.1" },
    blockSize: 16,
    maxModelLen: 8192,
    kvEvents: {
      endpoint: e.kvRanks[0].endpoint,
      replayEndpoint: e.kvRanks[0].replayEndpoint ?? undefined,
      topic: "kv-events",
      framing: "seq",
    },
  }));
}

async function sources(url: string): Promise<{ local: number; external: number }> {
  const t = await (await fetch(`${url}/metrics`)).text();
  const get = (source: string) => parseMetric(t, "vllm:prompt_tokens_by_source_total", { source }) ?? 0;
  return { local: get("local_compute"), external: get("external_kv_transfer") };
}

for (const kind of ["nixl", "sglang"] as const) {
  describe(`fleet PD per engine (${kind}): 2 P engines in one process, 2 D engines in another`, () => {
    let pFleet: FleetProcess;
    let dFleet: FleetProcess;
    let server: ServerProcess;
    let base = 0;
    before(async () => {
      base = await freePortRun(2);
      [pFleet, dFleet] = await Promise.all([
        spawnFleet(2, fleetArgs(kind, "prefill", base)),
        spawnFleet(2, fleetArgs(kind, "decode", base)),
      ]);
      server = await startStaticServer([
        ...records(pFleet.manifest, kind, "prefill", base),
        ...records(dFleet.manifest, kind, "decode", base),
      ]);
    });
    after(async () => {
      await server?.stop();
      await Promise.all([pFleet?.stop(), dFleet?.stop()]);
    });

    it("each P engine listens on its own PD port", async () => {
      if (kind === "sglang") {
        // SGLang's bootstrap server answers GET /health "OK" (sgl-project/sglang
        // python/sglang/srt/disaggregation/common/conn.py @ 0094505da74125a31ceb354f37ae7a1b6a97d3f5).
        for (const i of [0, 1]) {
          const r = await fetch(`http://127.0.0.1:${base + i}/health`);
          assert.equal(r.status, 200);
          assert.equal(await r.text(), "OK");
        }
        return;
      }
      // Nixl: P's answer names its side channel in remote_host/remote_port
      // (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py
      // @ 0050936b22adda2ef0197fa3bb2551fe6c5437dc, request_finished).
      for (const e of pFleet.manifest.engines) {
        const r = await fetch(`${e.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            model: MODEL,
            prompt: `side channel of engine ${e.index}`,
            max_tokens: 1,
            kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false },
          }),
        });
        assert.equal(r.status, 200);
        const p = ((await r.json()) as { kv_transfer_params: Record<string, unknown> }).kv_transfer_params;
        assert.equal(p.remote_port, base + e.index);
        assert.equal(p.remote_host, "127.0.0.1");
      }
    });

    it("through infera server, every P and every D engine takes part in PD", async () => {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
      const pUrls = pFleet.manifest.engines.map((e) => e.url);
      const dUrls = dFleet.manifest.engines.map((e) => e.url);
      const beforeP = await Promise.all(pUrls.map(sources));
      const beforeD = await Promise.all(dUrls.map(sources));
      // At once: the router picks the least-loaded D (router/disagg/select.ts), so concurrent
      // requests spread over both D engines, and round-robin spreads them over the P engines.
      const answers = await Promise.all(
        Array.from({ length: 6 }, (_, k) =>
          client.chat.completions.create({
            model: MODEL,
            messages: [
              {
                role: "user",
                content: `[${kind} ${k}] ${"Each fleet engine is its own prefill or decode worker. ".repeat(10)}`,
              },
            ],
            max_tokens: 16,
          }),
        ),
      );
      for (const r of answers) assert.equal(r.usage?.completion_tokens, 16);
      const afterP = await Promise.all(pUrls.map(sources));
      const afterD = await Promise.all(dUrls.map(sources));
      afterP.forEach((s, i) => {
        assert.ok(s.local > beforeP[i].local, `P engine ${i} prefilled`);
      });
      afterD.forEach((s, i) => {
        assert.ok(s.external > beforeD[i].external, `D engine ${i} pulled KV from a P engine`);
      });
      const workers = (await (await fetch(`${server.url}/v1/workers`)).json()) as { data: { url: string }[] };
      assert.deepEqual(workers.data.map((w) => w.url).sort(), [...pUrls, ...dUrls].sort());
    });
  });
}
