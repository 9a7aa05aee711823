/**
 * A full PD round trip per connector through `infera server --discovery etcd`, with each
 * half started by the real launcher command line in the matching engine personality:
 * `infera engine vllm|sglang|atom --sim ... -- --speed 20` runs the sim with exactly the
 * arguments and environment the real engine would get, and registers the real kind in etcd.
 *
 * Per connector: chat and completions, streamed and not, through the `openai` client; each
 * answer must come from D after a KV transfer from P:
 * - P prefilled (its `<engine>:prompt_tokens_total` grew) and generated at most one token per
 *   request (the prefill half is capped at max_tokens 1);
 * - D imported the prompt's KV instead of computing it: vLLM's
 *   `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}` grew on D (vllm-project/
 *   vllm vllm/v1/metrics/loggers.py), or, where the personality has no such family, D's
 *   usage reports the prompt as cached (`prompt_tokens_details.cached_tokens`).
 *
 * MoRIIO (vLLM) needs proxy_ip/proxy_ping_port (vllm-project/vllm vllm/distributed/
 * kv_transfer/kv_connector/v1/moriio/moriio_common.py @ 42fa4c096d406754b7e5c6d93835fe390487c8af):
 * the stage (test/helpers/pd-etcd.ts) owns the registration ROUTER, and the test checks each
 * worker's ping names its transfer_mode. The server still finds the workers in etcd, and runs READ serially, WRITE
 * concurrently (record `connector.transferMode`, as vllm-project/router
 * src/routers/http/moriio_pd_router.rs @ a9e5c5280ab38277ba788f9e6efb3c2fdb0a9515 picks the
 * mode from the registrations).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { type SimPersonality, simEngineWords } from "../../helpers/launcher.ts";
import { type PdEtcdStage, startPdEtcdStage } from "../../helpers/pd-etcd.ts";
import { waitUntil } from "../../helpers/wait.ts";

const PREFIX = "/pd-real";

interface Case {
  name: string;
  engine: SimPersonality;
  connector: string;
  moriioMode?: "read" | "write";
  /** The record's connector kind (SGLang/ATOM register their own bootstrap protocol). */
  kind: string;
}

const CASES: Case[] = [
  { name: "vllm nixl", engine: "vllm", connector: "nixl", kind: "nixl" },
  { name: "vllm mooncake", engine: "vllm", connector: "mooncake", kind: "mooncake" },
  { name: "vllm moriio READ", engine: "vllm", connector: "moriio", moriioMode: "read", kind: "moriio" },
  { name: "vllm moriio WRITE", engine: "vllm", connector: "moriio", moriioMode: "write", kind: "moriio" },
  { name: "sglang mooncake", engine: "sglang", connector: "mooncake", kind: "sglang" },
  { name: "atom moriio", engine: "atom", connector: "moriio", kind: "atom" },
  { name: "atom mooncake", engine: "atom", connector: "mooncake", kind: "atom" },
];

/** Only some personalities: INFERA_PD_REAL=vllm,sglang (default: all). */
const ONLY = (process.env.INFERA_PD_REAL ?? "").split(",").filter((s) => s !== "");

/** Sum of a metric family's samples matching `labels` (undefined when the family is absent). */
function sumMetric(text: string, re: RegExp, labels: Record<string, string> = {}): number | undefined {
  let found = false;
  let sum = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m || !re.test(m[1])) continue;
    if (!Object.entries(labels).every(([k, v]) => (m[2] ?? "").includes(`${k}="${v}"`))) continue;
    found = true;
    sum += Number(m[3]);
  }
  return found ? sum : undefined;
}

interface Evidence {
  /** Prompt tokens P computed (`<engine>:prompt_tokens_total`). */
  pPrompt: number;
  /** Tokens P generated. */
  pGen: number;
  /** Prompt tokens D imported from P (vLLM family; undefined where the engine has none). */
  dExternal: number | undefined;
  /** Prompt tokens D computed itself (vLLM family). */
  dLocal: number | undefined;
}

async function evidence(p: WorkerRecord, d: WorkerRecord): Promise<Evidence> {
  const [pm, dm] = await Promise.all([p, d].map(async (r) => (await fetch(`${r.url}/metrics`)).text()));
  const bySource = /^vllm:prompt_tokens_by_source_total$/;
  return {
    pPrompt: sumMetric(pm, /^\w+:prompt_tokens_total$/) ?? 0,
    pGen: sumMetric(pm, /^\w+:generation_tokens_total$/) ?? 0,
    dExternal: sumMetric(dm, bySource, { source: "external_kv_transfer" }),
    dLocal: sumMetric(dm, bySource, { source: "local_compute" }),
  };
}

describe("PD round trip per connector: real launcher command lines, infera server over etcd", () => {
  // The stage owns the MoRIIO registration ROUTER and records each worker's ping.
  let stage: PdEtcdStage;
  before(async () => {
    stage = await startPdEtcdStage({ prefix: PREFIX, serverKeepChars: 8000 });
  });
  after(async () => {
    await stage?.close();
  });

  const launch = (c: Case, role: "prefill" | "decode", model: string) =>
    stage.launch({
      words: simEngineWords(c.engine),
      model,
      role,
      connector: c.connector,
      moriio: c.engine === "vllm" && c.connector === "moriio" ? { mode: c.moriioMode ?? "read" } : undefined,
      simArgs: ["--speed", "20"],
    });

  for (const c of CASES) {
    const skip = ONLY.length > 0 && !ONLY.includes(c.engine);
    it(`${c.name}: 1P1D, chat and completions streamed and not, answered by D from P's KV`, {
      skip,
    }, async () => {
      const model = `real-${c.name.replace(/\W+/g, "-").toLowerCase()}`;
      const [p, d] = await Promise.all([launch(c, "prefill", model), launch(c, "decode", model)]);
      const ids = [`${model}-prefill`, `${model}-decode`];
      const { watcher, serverBase, pings } = stage;
      const diag = () =>
        `\n--- server ---\n${stage.serverLog()}\n--- P ---\n${p.output()}\n--- D ---\n${d.output()}`;
      try {
        await waitUntil(
          () => ids.every((id) => watcher.workers().some((r) => r.id === id)),
          60_000,
          `${c.name} pair in etcd`,
          25,
        );
        const [pr, dr] = ids.map((id) => watcher.workers().find((r) => r.id === id) as WorkerRecord);
        assert.equal(pr.role, "prefill");
        assert.equal(dr.role, "decode");
        assert.equal(pr.engine, c.engine, "the launcher registers the real engine kind");
        assert.equal(pr.connector.kind, c.kind);
        assert.equal(dr.connector.kind, c.kind);
        if (c.kind === "moriio") {
          const mode = c.moriioMode === "write" ? "WRITE" : "READ";
          assert.equal(pr.connector.transferMode, mode);
          // Each worker pings the proxy with its HTTP address and mode (vLLM `_ping`).
          await waitUntil(
            () => [pr, dr].every((r) => pings.has(new URL(r.url).host)),
            15_000,
            "MoRIIO registration pings",
            25,
          );
          for (const r of [pr, dr]) {
            const ping = pings.get(new URL(r.url).host);
            assert.equal(ping?.type, r.role === "prefill" ? "P" : "D");
            assert.equal(ping?.transfer_mode, mode);
          }
        }
        await stage.serverSees(ids, 15_000);
        const client = new OpenAI({ baseURL: `${serverBase}/v1`, apiKey: "x", maxRetries: 0 });
        const prompt = (tag: string) =>
          `[${c.name} ${tag}] ${"Disaggregated serving moves the prompt's KV from P to D. ".repeat(8)}`;
        let requests = 0;
        let cached = 0;
        const before0 = await evidence(pr, dr);

        // chat, not streamed
        const chat = await client.chat.completions.create({
          model,
          messages: [{ role: "user", content: prompt("chat") }],
          max_tokens: 6,
        });
        requests++;
        assert.equal(chat.usage?.completion_tokens, 6);
        assert.ok((chat.choices[0]?.message.content ?? "").length > 0);
        cached += chat.usage?.prompt_tokens_details?.cached_tokens ?? 0;

        // chat, streamed with usage
        const stream = await client.chat.completions.create({
          model,
          messages: [{ role: "user", content: prompt("chat-stream") }],
          max_tokens: 6,
          stream: true,
          stream_options: { include_usage: true },
        });
        let text = "";
        let streamedCompletion = 0;
        for await (const chunk of stream) {
          text += chunk.choices[0]?.delta?.content ?? "";
          if (chunk.usage) {
            streamedCompletion = chunk.usage.completion_tokens;
            cached += chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
          }
        }
        requests++;
        assert.ok(text.length > 0, "streamed chat carried text");
        assert.equal(streamedCompletion, 6);

        // completions, not streamed and streamed
        const comp = await client.completions.create({ model, prompt: prompt("completion"), max_tokens: 5 });
        requests++;
        assert.equal(comp.usage?.completion_tokens, 5);
        const cs = await client.completions.create({
          model,
          prompt: prompt("completion-stream"),
          max_tokens: 5,
          stream: true,
        });
        let ctext = "";
        for await (const chunk of cs) ctext += chunk.choices[0]?.text ?? "";
        requests++;
        assert.ok(ctext.length > 0, "streamed completion carried text");

        const after0 = await evidence(pr, dr);
        assert.ok(after0.pPrompt > before0.pPrompt, `P prefilled (${before0.pPrompt} -> ${after0.pPrompt})`);
        assert.ok(
          after0.pGen - before0.pGen <= requests,
          `P generated at most one token per request (${after0.pGen - before0.pGen} for ${requests})`,
        );
        if (after0.dExternal !== undefined) {
          const ext = after0.dExternal - (before0.dExternal ?? 0);
          assert.ok(ext > 0, `D imported P's KV (external tokens +${ext})`);
          const local = (after0.dLocal ?? 0) - (before0.dLocal ?? 0);
          assert.ok(local < ext, `D did not recompute the prompts (local +${local}, external +${ext})`);
        } else {
          assert.ok(cached > 0, "D's usage reports the prompt as cached (KV from P)");
        }
      } catch (err) {
        throw new Error(`${(err as Error).message}${diag()}`);
      }
      stage.stop(p);
      stage.stop(d);
      await waitUntil(
        () => !ids.some((id) => watcher.workers().some((r) => r.id === id)),
        10_000,
        "pair gone",
        25,
      );
    });
  }
});
