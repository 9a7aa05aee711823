import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type {
  HeldKv,
  PdRequestInfo,
  PulledKv,
  SimConnector,
  SimKvHost,
} from "../../../src/engine/sim/pd/types.ts";
import { type SimHandle, startSimEngine } from "../../../src/engine/sim/server.ts";
import { UpstreamError } from "../../../src/protocol/errors.ts";
import { parseMetric } from "../../helpers/sim.ts";

process.env.INFERA_LOG_LEVEL ??= "warn";

// The core's half of the PD seam, exercised with an in-memory connector pair: P's held KV
// is handed to D through a shared map, so this tests hold/import/metrics, not a transport.
const wire = new Map<string, { tokens: number[]; host: SimKvHost }>();

function fakeConnector(role: "prefill" | "decode", host: SimKvHost): SimConnector {
  return {
    kind: "nixl",
    async start() {},
    async close() {},
    async onPrefillFinished(req: PdRequestInfo, held: HeldKv) {
      wire.set(req.requestId, { tokens: held.tokenIds, host });
      return {
        do_remote_prefill: true,
        do_remote_decode: false,
        remote_engine_id: host.engineId,
        remote_block_ids: held.blockIds,
        remote_request_id: req.requestId,
        remote_host: host.host,
        remote_port: host.httpPort,
        tp_size: host.tpSize,
      };
    },
    async pullForDecode(req: PdRequestInfo): Promise<PulledKv> {
      void role;
      const entry = wire.get(String(req.params.remote_request_id));
      if (!entry) throw new UpstreamError("prefill worker has no KV for this request", 502, "kv_pull_failed");
      wire.delete(req.requestId);
      entry.host.releaseHeld(req.requestId);
      return { tokenIds: entry.tokens, bytes: Math.ceil(entry.tokens.length / 16) * 16 * 131072 };
    },
    httpRoutes() {
      return { "/kv_transfer_info": () => ({ engine_id: host.engineId, tp_size: host.tpSize }) };
    },
  };
}

async function post(url: string, body: unknown, id: string): Promise<Response> {
  return fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": id },
    body: JSON.stringify(body),
  });
}

describe("sim core PD flow (hold on P, import on D) with an in-memory connector", () => {
  let p: SimHandle;
  let d: SimHandle;
  const prompt = Array.from({ length: 100 }, (_, i) => 3000 + i);

  before(async () => {
    const common = { host: "127.0.0.1", port: 0, speed: 100, kvEvents: null, model: "pd-model" };
    p = await startSimEngine({
      ...common,
      role: "prefill",
      connector: "nixl",
      connectorFactory: (o, h) => fakeConnector(o.role as "prefill", h),
    });
    d = await startSimEngine({
      ...common,
      role: "decode",
      connector: "nixl",
      connectorFactory: (o, h) => fakeConnector(o.role as "decode", h),
    });
  });
  after(async () => {
    await p?.close();
    await d?.close();
  });

  it("P computes the prompt, holds its blocks and answers with kv_transfer_params; D decodes without recomputing", async () => {
    const rp = await post(
      p.url,
      {
        model: "pd-model",
        prompt,
        max_tokens: 1,
        kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false },
      },
      "pd-1",
    );
    assert.equal(rp.status, 200);
    const pBody = (await rp.json()) as {
      kv_transfer_params: Record<string, unknown>;
      usage: { completion_tokens: number };
    };
    assert.equal(pBody.usage.completion_tokens, 1);
    const params = pBody.kv_transfer_params;
    assert.equal(params.do_remote_prefill, true);
    assert.equal((params.remote_block_ids as number[]).length, Math.ceil(prompt.length / 16));
    assert.equal(params.remote_engine_id, p.kvHost.engineId);
    assert.ok(p.kvHost.getHeld("pd-1"), "blocks held after the prefill finished");
    assert.ok(p.engine.pool.usage() > 0);

    const rd = await post(
      d.url,
      { model: "pd-model", prompt, max_tokens: 8, kv_transfer_params: params },
      "pd-1",
    );
    assert.equal(rd.status, 200);
    const dBody = (await rd.json()) as {
      usage: {
        prompt_tokens: number;
        completion_tokens: number;
        prompt_tokens_details: { cached_tokens: number };
      };
    };
    assert.equal(dBody.usage.prompt_tokens, 100);
    assert.equal(dBody.usage.completion_tokens, 8);
    assert.equal(dBody.usage.prompt_tokens_details.cached_tokens, 99);
    assert.equal(p.kvHost.getHeld("pd-1"), null, "P released after the pull");
    assert.equal(p.engine.pool.usage(), 0);

    const dm = await d.engine.metrics.text();
    assert.equal(
      parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }),
      99,
    );
    assert.equal(parseMetric(dm, "vllm:prompt_tokens_by_source_total", { source: "local_compute" }), 1);
    const pm = await p.engine.metrics.text();
    assert.equal(parseMetric(pm, "vllm:prompt_tokens_by_source_total", { source: "local_compute" }), 100);
  });

  it("a failed pull is a clean OpenAI-shaped error on D and leaves no blocks allocated", async () => {
    const r = await post(
      d.url,
      {
        model: "pd-model",
        prompt,
        max_tokens: 4,
        kv_transfer_params: { do_remote_prefill: true, remote_request_id: "never-prefilled" },
      },
      "pd-missing",
    );
    assert.equal(r.status, 502);
    const body = (await r.json()) as { error: { code: string; type: string } };
    assert.equal(body.error.code, "kv_pull_failed");
    assert.equal(d.engine.pool.usage(), 0);
    assert.equal(d.engine.scheduler.imports.size, 0);
  });

  it("serves the connector's extra HTTP routes", async () => {
    const r = await fetch(`${p.url}/kv_transfer_info`);
    assert.equal(r.status, 200);
    assert.equal(((await r.json()) as { engine_id: string }).engine_id, p.kvHost.engineId);
  });
});
