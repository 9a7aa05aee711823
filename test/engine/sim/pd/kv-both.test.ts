/**
 * vLLM's NixlConnector runs both halves with the same `kv_role: "kv_both"` config and no role
 * flag: each request's kv_transfer_params say whether the engine acts as P or D. Two sims
 * started identically must therefore do a full PD exchange, in either direction.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { parseMetric, type SimProcess, startSim } from "../../../helpers/sim.ts";
import { drivePd, simRecord, usageOf } from "./drive.ts";

const sims: SimProcess[] = [];
after(async () => {
  await Promise.all(sims.map((s) => s.stop()));
});

const cfg = JSON.stringify({
  kv_connector: "NixlConnector",
  kv_role: "kv_both",
  kv_connector_extra_config: { side_channel_port: 0 },
});

test("two identical kv_both Nixl sims act as P or D per request", async () => {
  const [a, b] = await Promise.all(
    [0, 1].map(() => startSim({ args: ["--kv-transfer-config", cfg, "--speed", "10"] })),
  );
  sims.push(a, b);
  const prompt = "Both engines were launched the same way; the request decides their roles. ".repeat(10);
  const body = { model: "sim-model", messages: [{ role: "user", content: prompt }], max_tokens: 8 };
  for (const [p, d, tag] of [
    [a, b, "ab"],
    [b, a, "ba"],
  ] as const) {
    const run = await drivePd(
      simRecord(p, "prefill", { kind: "nixl", bootstrapHost: "127.0.0.1" }),
      simRecord(d, "decode", { kind: "nixl", bootstrapHost: "127.0.0.1" }),
      body,
      `kvboth-${tag}-${"0123456789abcdef".repeat(2)}`,
    );
    assert.equal(run.prefillStatus, 200, JSON.stringify(run.prefillJson));
    const kvp = run.prefillJson?.kv_transfer_params as Record<string, unknown>;
    assert.equal(kvp.do_remote_prefill, true);
    assert.equal(run.decodeStatus, 200, run.decodeText);
    assert.equal(usageOf(run.decodeText)?.completion_tokens, 8);
    const external =
      parseMetric(await d.metrics(), "vllm:prompt_tokens_by_source_total", {
        source: "external_kv_transfer",
      }) ?? 0;
    assert.ok(external > 0, `${tag}: D pulled P's KV`);
  }
});
