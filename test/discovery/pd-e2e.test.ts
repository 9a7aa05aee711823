/**
 * PD through the launchers: for each connector, `infera engine sim --role prefill|decode
 * --connector K` registers both halves in etcd with the connector fields the router needs
 * (bootstrap host/ports), and `infera server --discovery etcd` serves a request through the
 * prefill/decode pair.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { simEngineWords } from "../helpers/launcher.ts";
import { type PdEtcdStage, startPdEtcdStage } from "../helpers/pd-etcd.ts";
import { waitUntil } from "../helpers/wait.ts";

/** Polls every 25 ms. */
const waitFor = (cond: () => boolean | Promise<boolean>, timeoutMs: number, what: string) =>
  waitUntil(cond, timeoutMs, what, 25);

describe("PD pairs launched by infera engine sim, routed by infera server over etcd", () => {
  // MoRIIO workers ping the stage's registration ROUTER (vLLM's `_ping`); the server finds
  // them in etcd.
  let stage: PdEtcdStage;
  before(async () => {
    stage = await startPdEtcdStage({ prefix: "/pd", serverKeepChars: 6000 });
  });
  after(async () => {
    await stage?.close();
  });

  const launch = (kind: string, role: "prefill" | "decode", model: string) =>
    stage.launch({
      words: simEngineWords("sim"),
      model,
      role,
      connector: kind,
      moriio: kind === "moriio" ? {} : undefined,
      simArgs: ["--speed", "50"],
    });

  for (const kind of ["nixl", "mooncake", "moriio", "sglang", "atom"]) {
    it(`${kind}: 1P1D registered with its connector, served through the server`, async () => {
      const model = `pd-${kind}`;
      const [p, d] = [await launch(kind, "prefill", model), await launch(kind, "decode", model)];
      const ids = [`${model}-prefill`, `${model}-decode`];
      const { watcher, serverBase } = stage;
      await waitFor(
        () => ids.every((id) => watcher.workers().some((r) => r.id === id)),
        40_000,
        `${kind} pair`,
      );
      const recs = ids.map((id) => watcher.workers().find((r) => r.id === id));
      for (const r of recs) {
        assert.equal(r?.connector.kind, kind);
        assert.equal(r?.connector.bootstrapHost, "127.0.0.1");
      }
      assert.deepEqual(
        recs.map((r) => r?.role),
        ["prefill", "decode"],
      );
      // The server must see both halves before the request, or it routes the model mixed.
      await stage.serverSees(ids, 10_000);
      const client = new OpenAI({ baseURL: `${serverBase}/v1`, apiKey: "x", maxRetries: 0 });
      try {
        const res = await client.chat.completions.create({
          model,
          messages: [
            {
              role: "user",
              content: `a prompt long enough to fill a few blocks for ${kind} ${"x ".repeat(60)}`,
            },
          ],
          max_tokens: 4,
        });
        assert.ok((res.usage?.completion_tokens ?? 0) > 0);
        // D imported the prompt's KV from P: the pair really ran as PD.
        const dMetrics = await (await fetch(`${recs[1]?.url}/metrics`)).text();
        const external = dMetrics
          .split("\n")
          .filter(
            (l) =>
              l.startsWith("vllm:prompt_tokens_by_source_total{") && l.includes('"external_kv_transfer"'),
          )
          .reduce((a, l) => a + Number(l.split(" ").pop()), 0);
        assert.ok(external > 0, `decode worker got KV from prefill (external tokens ${external})`);
      } catch (err) {
        throw new Error(`${(err as Error).message}\n--- server ---\n${stage.serverLog()}`);
      }
      stage.stop(p);
      stage.stop(d);
      await waitFor(() => !ids.some((id) => watcher.workers().some((r) => r.id === id)), 2000, "pair gone");
    });
  }
});
