/**
 * kv-aware with LoRA adapters and data-parallel workers.
 *
 * LoRA: vLLM hashes a LoRA request's blocks with the adapter name first in every block's extra
 * keys (vllm-project/vllm vllm/v1/core/kv_cache_utils.py @ 001cabc1be16a59a70d720ed61a13b678c060a18,
 * generate_block_hash_extra_keys / _gen_lora_extra_hash_keys → [lora_request.lora_name]), reports
 * `lora_name` in BlockStored (vllm/v1/core/block_pool.py @ c59cb7941357443da7c5eef75cfa8697d683d228),
 * and a client selects the adapter by naming it in `model` (`--lora-modules name=path`; the server
 * checks `request.model in [lora.lora_name …]`: vllm/entrypoints/openai/serving_engine.py
 * @ 7ded96b3c73f63400cdb048a73c34292ba862d99, OpenAIServing._check_model).
 *
 * DP: vLLM's OpenAI server runs a request on the rank named by the `X-data-parallel-rank` header
 * (OpenAIServing._get_data_parallel_rank in later revisions of the same file, passed on as
 * data_parallel_rank).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { KvIndex } from "../../../src/kv/index.ts";
import { MixedRouter } from "../../../src/router/mixed.ts";
import type {
  RequestExecutor,
  RoutingPolicy,
  RoutingRequest,
  SendOptions,
  UpstreamResponse,
} from "../../../src/router/types.ts";
import { LiveWorker, type WorkerSet } from "../../../src/router/worker-set.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../../src/util/log.ts";
import { storedPrefix } from "../../helpers/kv-events.ts";
import { presetScheduler } from "./preset.ts";

const BS = 16;
const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();

function worker(id: string, engine: WorkerRecord["engine"] = "vllm", dpSize = 1): LiveWorker {
  return new LiveWorker({
    id,
    model: "base",
    servedModelNames: ["base", "sql"],
    engine,
    role: "mixed",
    url: `http://${id}`,
    connector: { kind: "none" },
    blockSize: BS,
    kvEvents: {
      endpoint: "tcp://127.0.0.1:1",
      topic: "",
      framing: "seq",
      ranks:
        dpSize > 1
          ? Array.from({ length: dpSize }, (_, r) => ({ dpRank: r, endpoint: `tcp://127.0.0.1:${1 + r}` }))
          : undefined,
    },
    dpSize,
    tpSize: 1,
    maxModelLen: 32768,
    startedAt: "",
  });
}

let n = 0;
function request(text: string, model: string): RoutingRequest {
  const tokens = tok.encode(text);
  return {
    requestId: `r${n++}`,
    model,
    endpoint: "completion",
    body: { model, prompt: text },
    stream: false,
    promptText: () => text,
    promptTokens: () => tokens,
  };
}

function storedFor(tokens: readonly number[], hashBase: number, lora: string | null) {
  if (!lora) return storedPrefix(tokens, BS, hashBase, { groupIdx: 0 });
  const blocks = Math.floor(tokens.length / BS);
  // vLLM: the LoRA name in every block's extra keys.
  const extraKeys = Array.from({ length: blocks }, () => [lora]);
  return storedPrefix(tokens, BS, hashBase, { loraId: 1, loraName: lora, extraKeys, groupIdx: 0 });
}

const doc = Array.from({ length: 60 }, (_, i) => `Clause ${i} says the rate is ${i * 3}.`).join(" ");

function kvPolicy(index: KvIndex): RoutingPolicy {
  return presetScheduler("kv-aware", { logger, kvIndex: index });
}

test("a LoRA request goes to the worker that cached the prompt under that adapter, a base request does not", () => {
  const index = new KvIndex();
  const [a, b] = [worker("a"), worker("b")];
  const tokens = tok.encode(doc);
  index.applyEvents("a", [storedFor(tokens, 100, null)], BS);
  index.applyEvents("b", [storedFor(tokens, 100, "sql")], BS);
  const policy = kvPolicy(index);
  const lora = policy.select(request(doc, "sql"), [a, b]);
  assert.equal(lora.worker.record.id, "b");
  assert.ok((lora.overlapBlocks ?? 0) > 0);
  const base = policy.select(request(doc, "base"), [a, b]);
  assert.equal(base.worker.record.id, "a");
  assert.ok((base.overlapBlocks ?? 0) > 0);
});

test("a vLLM DP worker is pinned to the rank holding the prefix; the mixed router sends X-data-parallel-rank", async () => {
  const index = new KvIndex();
  const w = worker("dp", "vllm", 2);
  const other = worker("x", "vllm", 1);
  const tokens = tok.encode(doc);
  index.addWorker("dp", BS);
  index.addWorker("x", BS);
  index.applyEvents("dp", [storedFor(tokens, 100, null)], BS, 1);
  const policy = kvPolicy(index);
  const sel = policy.select(request(doc, "base"), [w, other]);
  assert.equal(sel.worker.record.id, "dp");
  assert.equal(sel.dpRank, 1);

  const sent: SendOptions[] = [];
  const exec: RequestExecutor = {
    async send(_w, _e, _b, opts): Promise<UpstreamResponse> {
      sent.push(opts);
      return {
        status: 200,
        headers: {},
        body: (async function* () {})(),
        json: async () => ({}),
        abort: () => {},
      };
    },
  };
  const stubSet = { reportFailure: () => {}, reportSuccess: () => {} } as unknown as WorkerSet;
  const router = new MixedRouter({
    model: "base",
    candidates: () => [w, other],
    policy,
    workers: stubSet,
    maxRetries: 0,
    trackPrefill: false,
    logger,
  });
  const up = await router.handle(request(doc, "base"), exec, new AbortController().signal);
  for await (const _ of up.body) {
    // drain
  }
  assert.equal(sent[0].headers?.["x-data-parallel-rank"], "1");

  // A record per rank (external load balancing) is never pinned.
  const single = worker("one", "vllm", 1);
  index.applyEvents("one", [storedFor(tokens, 100, null)], BS, 3);
  assert.equal(policy.select(request(doc, "base"), [single]).dpRank, undefined);
  // No hit anywhere: no pin (vLLM's own balancer decides).
  const cold = policy.select(request("An unrelated question about tides and moons.", "base"), [w, other]);
  assert.equal(cold.dpRank, undefined);
  // SGLang workers are scored by their best rank without pinning.
  const s = worker("sg", "sglang", 2);
  index.applyEvents("sg", [storedFor(tokens, 100, null)], BS, 1);
  const sg = policy.select(request(doc, "base"), [s]);
  assert.equal(sg.dpRank, undefined);
  assert.ok((sg.overlapBlocks ?? 0) > 0);
});
