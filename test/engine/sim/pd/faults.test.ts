/**
 * PD faults on the sims themselves: a pull from a dead P, a pull that times out, a P whose
 * blocks nobody pulls, and Mooncake's P completing a request without transfer_id (vLLM only
 * warns) while freeing its blocks. Every failure is an OpenAI-shaped 4xx/5xx, and P frees what
 * it held.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { freePort } from "../../../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../../../helpers/sim.ts";

const sims: SimProcess[] = [];
after(async () => {
  await Promise.all(sims.map((s) => s.stop()));
});

async function sim(role: string, kind: string, kvCfg: Record<string, unknown>, extra: string[] = []) {
  const s = await startSim({
    args: [
      "--role",
      role,
      "--connector",
      kind,
      "--kv-transfer-config",
      JSON.stringify(kvCfg),
      "--speed",
      "10",
      ...extra,
    ],
  });
  sims.push(s);
  return s;
}

const messages = [
  { role: "user", content: "A prompt long enough to fill a few KV blocks on the prefill side. ".repeat(6) },
];

async function post(url: string, body: Record<string, unknown>, rid: string) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": rid },
    body: JSON.stringify({ model: "sim-model", messages, ...body }),
  });
  return { status: r.status, json: (await r.json()) as Record<string, unknown> };
}

function assertOpenAIError(json: Record<string, unknown>) {
  const e = json.error as Record<string, unknown>;
  assert.ok(e && typeof e.message === "string" && typeof e.type === "string", JSON.stringify(json));
  assert.ok("param" in e && "code" in e);
}

const kvUsage = async (s: SimProcess) => parseMetric(await s.metrics(), "vllm:kv_cache_usage_perc") ?? -1;
const running = async (s: SimProcess) => parseMetric(await s.metrics(), "vllm:num_requests_running") ?? -1;

async function waitFor(pred: () => Promise<boolean>, ms = 5000) {
  const end = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error("condition not reached in time");
    await new Promise((r) => setTimeout(r, 25));
  }
}

const nixlCfg = {
  kv_connector: "NixlConnector",
  kv_role: "kv_both",
  kv_connector_extra_config: { side_channel_port: 0 },
};
const toP = {
  stream: false,
  max_tokens: 1,
  kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false },
};

test("nixl: D pulling from a P that died answers 502 in OpenAI's shape and stays healthy", async () => {
  const [p, d] = await Promise.all([sim("prefill", "nixl", nixlCfg), sim("decode", "nixl", nixlCfg)]);
  const pr = await post(p.url, toP, "dead-p-1");
  assert.equal(pr.status, 200);
  await p.stop();
  const dr = await post(d.url, { max_tokens: 5, kv_transfer_params: pr.json.kv_transfer_params }, "dead-p-1");
  assert.equal(dr.status, 502);
  assertOpenAIError(dr.json);
  assert.match(String((dr.json.error as { message: string }).message), /KV pull/);
  assert.equal(await running(d), 0);
  assert.equal(await kvUsage(d), 0);
  const ok = await post(d.url, { max_tokens: 3 }, "plain-after");
  assert.equal(ok.status, 200, "D still serves ordinary requests");
});

test("P frees blocks nobody pulled after its hold timeout", async () => {
  const p = await sim("prefill", "nixl", nixlCfg, ["--kv-hold-timeout-ms", "400"]);
  const pr = await post(p.url, toP, "unpulled-1");
  assert.equal(pr.status, 200);
  assert.ok((await kvUsage(p)) > 0, "P holds the prompt's blocks");
  await waitFor(async () => (await kvUsage(p)) === 0, 3000);
});

// vllm-project/vllm mooncake/mooncake_connector.py @ 00f4240ee6458263d76cf51ca7901ce1350bb4d1:
// P only warns about a missing transfer_id; a transfer P never registered fails on D when the wait
// for it runs out (the sim: its pull timeout).
test("mooncake: a transfer P never serves times out on D with 504; P completes a request without transfer_id and frees it", async () => {
  const port = await freePort();
  const p = await sim("prefill", "mooncake", {
    kv_connector: "MooncakeConnector",
    kv_role: "kv_producer",
    kv_connector_extra_config: { bootstrap_port: port },
  });
  const d = await sim("decode", "mooncake", {
    kv_connector: "MooncakeConnector",
    kv_role: "kv_consumer",
    kv_connector_extra_config: { sim_pull_timeout_ms: 400 },
  });
  const dropped = await post(p.url, toP, "no-xfer");
  assert.equal(dropped.status, 200);
  assert.equal(dropped.json.kv_transfer_params ?? null, null);
  await waitFor(async () => (await kvUsage(p)) === 0, 3000);
  const q = (await (await fetch(`http://127.0.0.1:${port}/query`)).json()) as Record<
    string,
    { engine_id: string }
  >;
  const t0 = Date.now();
  const dr = await post(
    d.url,
    {
      max_tokens: 5,
      kv_transfer_params: {
        do_remote_prefill: true,
        do_remote_decode: false,
        remote_bootstrap_addr: `http://127.0.0.1:${port}`,
        remote_engine_id: q["0"].engine_id,
        transfer_id: "xfer-never",
      },
    },
    "never-1",
  );
  assert.equal(dr.status, 504);
  assertOpenAIError(dr.json);
  assert.ok(Date.now() - t0 < 15_000, "the configured 400 ms pull timeout, not the 30 s default");
  assert.equal(await running(d), 0);
});
