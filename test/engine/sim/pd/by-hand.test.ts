/**
 * PD driven by hand, per connector: a prefill sim and a decode sim as child processes, the
 * halves sent exactly as the router would, and D's metrics showing it computed locally only
 * what it did not pull (vllm:prompt_tokens_by_source_total).
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import type { ConnectorInfo } from "../../../../src/discovery/types.ts";
import { freePort } from "../../../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../../../helpers/sim.ts";
import { contentOf, drivePd, simRecord, usageOf } from "./drive.ts";

const sims: SimProcess[] = [];
after(async () => {
  await Promise.all(sims.map((s) => s.stop()));
});

async function sim(
  role: "prefill" | "decode",
  kind: string,
  kvCfg: Record<string, unknown>,
  extraArgs: string[] = [],
) {
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
      ...extraArgs,
    ],
  });
  sims.push(s);
  return s;
}

const longPrompt = "The prefill worker reads this whole prompt once so that decode does not have to. ".repeat(
  12,
);
const body = (stream: boolean) => ({
  model: "sim-model",
  messages: [{ role: "user", content: longPrompt }],
  max_tokens: 12,
  stream,
  ...(stream ? { stream_options: { include_usage: true } } : {}),
});

async function waitFor(pred: () => Promise<boolean>, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error("condition not reached in time");
    await new Promise((r) => setTimeout(r, 25));
  }
}

interface Case {
  kind: "nixl" | "mooncake" | "moriio" | "sglang" | "atom";
  setup(): Promise<{
    pCfg: Record<string, unknown>;
    dCfg: Record<string, unknown>;
    pInfo: Omit<ConnectorInfo, "kind">;
  }>;
}

const cases: Case[] = [
  {
    kind: "nixl",
    async setup() {
      const cfg = {
        kv_connector: "NixlConnector",
        kv_role: "kv_both",
        kv_connector_extra_config: { side_channel_port: 0 },
      };
      return { pCfg: cfg, dCfg: cfg, pInfo: { bootstrapHost: "127.0.0.1" } };
    },
  },
  {
    kind: "mooncake",
    async setup() {
      const port = await freePort();
      return {
        pCfg: {
          kv_connector: "MooncakeConnector",
          kv_role: "kv_producer",
          kv_connector_extra_config: { bootstrap_port: port },
        },
        dCfg: { kv_connector: "MooncakeConnector", kv_role: "kv_consumer" },
        pInfo: { bootstrapHost: "127.0.0.1", bootstrapPort: port },
      };
    },
  },
  {
    kind: "moriio",
    async setup() {
      const [hs, nt, dhs, dnt] = [await freePort(), await freePort(), await freePort(), await freePort()];
      // proxy_ip / proxy_ping_port / http_port are required by vLLM's MoRIIOConfig
      // (moriio_common.py @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03); no proxy listens on port 9.
      const extra = (h: number, n: number) => ({
        proxy_ip: "127.0.0.1",
        proxy_ping_port: 9,
        http_port: 0,
        handshake_port: h,
        notify_port: n,
        read_mode: true,
      });
      return {
        pCfg: {
          kv_connector: "MoRIIOConnector",
          kv_role: "kv_producer",
          kv_connector_extra_config: extra(hs, nt),
        },
        dCfg: {
          kv_connector: "MoRIIOConnector",
          kv_role: "kv_consumer",
          kv_connector_extra_config: extra(dhs, dnt),
        },
        pInfo: { bootstrapHost: "127.0.0.1", handshakePort: hs, notifyPort: nt },
      };
    },
  },
  {
    kind: "sglang",
    async setup() {
      const port = await freePort();
      return {
        pCfg: { kv_connector: "sglang", bootstrap_port: port },
        dCfg: { kv_connector: "sglang" },
        pInfo: { bootstrapHost: "127.0.0.1", bootstrapPort: port },
      };
    },
  },
  {
    kind: "atom",
    async setup() {
      const port = await freePort();
      return {
        pCfg: { kv_connector: "moriio", kv_role: "kv_producer", handshake_port: port },
        dCfg: { kv_connector: "moriio", kv_role: "kv_consumer", handshake_port: 0 },
        pInfo: { bootstrapHost: "127.0.0.1", handshakePort: port },
      };
    },
  },
];

for (const c of cases) {
  describe(`PD by hand: ${c.kind}`, () => {
    test("streamed and not: D answers in full and computes only what it did not pull; P frees its blocks", async () => {
      const { pCfg, dCfg, pInfo } = await c.setup();
      const [p, d] = await Promise.all([sim("prefill", c.kind, pCfg), sim("decode", c.kind, dCfg)]);
      const pRec = simRecord(p, "prefill", { kind: c.kind, ...pInfo });
      const dRec = simRecord(d, "decode", {
        kind: c.kind,
        bootstrapHost: "127.0.0.1",
        ...(c.kind === "moriio"
          ? {
              handshakePort: (dCfg.kv_connector_extra_config as { handshake_port: number }).handshake_port,
              notifyPort: (dCfg.kv_connector_extra_config as { notify_port: number }).notify_port,
            }
          : {}),
      });
      let pulledTotal = 0;
      let promptTotal = 0;
      for (const stream of [false, true]) {
        const rid = `${c.kind}-${stream ? "s" : "j"}-${"0123456789abcdef".repeat(2)}`;
        // MoRIIO needs a transfer_id on both halves (moriio_connector.py
        // @ 0158326ccc22cff86725bbaa452df5e6be966c5c reads params["transfer_id"]).
        const extraParams = c.kind === "moriio" ? { transfer_id: `tx-${rid}` } : {};
        const run = await drivePd(pRec, dRec, body(stream), rid, extraParams);
        assert.equal(run.prefillStatus, 200, JSON.stringify(run.prefillJson));
        assert.equal(run.decodeStatus, 200, run.decodeText);
        if (c.kind === "nixl" || c.kind === "moriio" || c.kind === "atom") {
          const kvp = run.prefillJson?.kv_transfer_params as Record<string, unknown>;
          assert.equal(kvp.do_remote_prefill, true);
          assert.ok(Array.isArray(kvp.remote_block_ids) && kvp.remote_block_ids.length > 0);
        }
        const usage = usageOf(run.decodeText);
        assert.ok(usage, "D reports usage");
        assert.equal(usage.completion_tokens, 12);
        assert.ok(contentOf(run.decodeText).length > 0);
        promptTotal += usage.prompt_tokens as number;
      }
      const m = await d.metrics();
      const external =
        parseMetric(m, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }) ?? 0;
      const local = parseMetric(m, "vllm:prompt_tokens_by_source_total", { source: "local_compute" }) ?? 0;
      const hit = parseMetric(m, "vllm:prompt_tokens_by_source_total", { source: "local_cache_hit" }) ?? 0;
      pulledTotal = external;
      assert.equal(external + local + hit, promptTotal, m);
      // The first request pulls everything P computed; D recomputes at most the last token(s)
      // of a partial block; the repeat may hit D's own cache for what it imported.
      assert.ok(external > 0, "D pulled KV");
      assert.ok(local <= 16, `D computed ${local} of ${promptTotal} prompt tokens locally`);
      assert.ok(pulledTotal + hit >= promptTotal - 2 * 16);
      await waitFor(async () => (parseMetric(await p.metrics(), "vllm:kv_cache_usage_perc") ?? 1) === 0);
    });
  });
}
