/**
 * A 40 k-token prompt is scored whole (issue #28 item 4): through a real server (kv-aware, KV
 * ingest) and two simulated engines publishing KV events over ZMQ, a worker holding every block
 * of the prompt is credited with every block. Before, routing read only the first 64 Ki
 * characters (≈ 12.6 k tokens of these words), so the prompt counted ≈ 790 blocks, not ≈ 2 500.
 *
 * Block boundaries: vLLM hashes only full blocks of `block_size` tokens ("We only hash full
 * blocks"): vllm-project/vllm vllm/v1/core/kv_cache_utils.py `get_request_block_hasher`
 * @ 001cabc1be16a59a70d720ed61a13b678c060a18; src/kv/hash.ts follows it, so the prompt's
 * blocks are floor(tokens / block_size).
 */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { Prng, words } from "../../src/loadgen/prng.ts";
import type { DecisionExplanation } from "../../src/router/pipeline/types.ts";
import { type InferaServer, startServer } from "../../src/server/app.ts";
import { configFromFile } from "../../src/server/config.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../src/util/log.ts";
import { kvEventsReceived, type SimProcess, simWorkerRecord, startSim } from "../helpers/sim.ts";
import { waitFor } from "../kv/fake-publisher.ts";

const BS = 16;
const MODEL = "sim-model";
const KEY = "debug-key";
const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();
const dir = mkdtempSync(join(tmpdir(), "infera-whole-prompt-"));
let sims: SimProcess[] = [];
let server: InferaServer;

const history = words(new Prng(40), 40_000);
const chat = (q: string) => [
  { role: "system" as const, content: history },
  { role: "user" as const, content: q },
];

before(async () => {
  const args = [
    "--block-size",
    String(BS),
    "--speed",
    "1000",
    "--max-model-len",
    "65536",
    "--num-gpu-blocks",
    "8192",
  ];
  sims = await Promise.all(["w-a", "w-b"].map(() => startSim({ args })));
  const file = join(dir, "infera.yaml");
  // A generous budget: this checks that the whole prompt is read, not how fast this box is
  // (bench/tokenizer measures that); a loaded CI box must not turn it into a partial score.
  writeFileSync(file, `policy: kv-aware\nscrapeIntervalMs: 0\napiKeys: [${KEY}]\npromptBudgetMs: 5000\n`);
  const memory = new MemoryDiscovery(
    ["w-a", "w-b"].map((id, i) =>
      simWorkerRecord(sims[i]!, { id, model: MODEL, maxModelLen: 65536, blockSize: BS }),
    ),
  );
  server = await startServer(
    { ...configFromFile(file), host: "127.0.0.1", port: 0 },
    { discovery: memory, logger },
  );
});

after(async () => {
  await server?.close();
  await Promise.all(sims.map((s) => s.stop()));
});

test("a 40 k-token prompt: a worker holding all its blocks is credited with all of them", async () => {
  const index = server.kvIngest!.indexFor(MODEL)!;
  await kvEventsReceived(sims[1]!, () => index.blockCount("w-b") > 0, { what: "w-b's KV events" });
  const warm = await fetch(`${sims[1]!.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: chat("warm"), max_tokens: 1 }),
  });
  assert.equal(warm.status, 200, await warm.text());
  const tokens = tok.encode(tok.applyChatTemplate(chat("q")));
  assert.ok(tokens.length > 40_000, `${tokens.length} tokens`);
  const blocks = Math.floor(tokens.length / BS);
  // The history's blocks (all but the last one or two, where "warm" and "q" differ).
  await waitFor(() => index.overlaps(tokens, ["w-a", "w-b"])[1]! >= blocks - 2, 10_000, "w-b indexed");
  const shared = index.overlaps(tokens, ["w-a", "w-b"])[1]!;

  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const res = await client.chat.completions.create({ model: MODEL, messages: chat("q"), max_tokens: 1 });
  assert.ok((res.usage?.prompt_tokens_details?.cached_tokens ?? 0) >= shared * BS, "served from w-b's cache");
  assert.equal(res.usage?.prompt_tokens, tokens.length, "the router's ids are the engine's");

  const got = (await (
    await fetch(`${server.url}/debug/decisions?model=${MODEL}&limit=1`, {
      headers: { authorization: `Bearer ${KEY}` },
    })
  ).json()) as { data: DecisionExplanation[] };
  const d = got.data[0]!;
  assert.equal(d.winner, "w-b");
  const [a, b] = d.candidates;
  // The whole prompt was hashed (≈ 2 500 blocks, not the ≈ 790 of a 64 Ki-character head) and
  // every block the engine reported is matched: the router's hashes are the engine's blocks.
  assert.equal(b!.promptBlocks, blocks);
  assert.equal(b!.cachedBlocks, shared);
  assert.equal(a!.cachedBlocks, 0);
  const metrics = await (
    await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })
  ).text();
  assert.match(metrics, /^infera_prompt_tokenized_total 1$/m);
  assert.match(metrics, /^infera_prompt_partial_total 0$/m);
});

test("a budget overrun degrades to a partial score of the prompt's head, not an error", async () => {
  // No budget at all: one piece is tokenized, then routing settles for it.
  const file = join(dir, "zero.yaml");
  writeFileSync(file, `policy: kv-aware\nscrapeIntervalMs: 0\napiKeys: [${KEY}]\npromptBudgetMs: 0\n`);
  const memory = new MemoryDiscovery(
    ["w-a", "w-b"].map((id, i) =>
      simWorkerRecord(sims[i]!, { id, model: MODEL, maxModelLen: 65536, blockSize: BS }),
    ),
  );
  const zero = await startServer(
    { ...configFromFile(file), host: "127.0.0.1", port: 0 },
    { discovery: memory, logger },
  );
  try {
    const client = new OpenAI({ baseURL: `${zero.url}/v1`, apiKey: KEY, maxRetries: 0 });
    const res = await client.chat.completions.create({ model: MODEL, messages: chat("q2"), max_tokens: 1 });
    assert.ok((res.usage?.prompt_tokens ?? 0) > 40_000, "the engine got the whole prompt");
    const got = (await (
      await fetch(`${zero.url}/debug/decisions?model=${MODEL}&limit=1`, {
        headers: { authorization: `Bearer ${KEY}` },
      })
    ).json()) as { data: DecisionExplanation[] };
    const c = got.data[0]!.candidates[0]!;
    assert.ok((c.promptBlocks ?? 0) > 0 && (c.promptBlocks ?? 0) < 100, `${c.promptBlocks} blocks scored`);
    const metrics = await (
      await fetch(`${zero.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })
    ).text();
    assert.match(metrics, /^infera_prompt_partial_total 1$/m);
  } finally {
    await zero.close();
  }
});
