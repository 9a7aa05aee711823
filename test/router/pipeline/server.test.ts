/**
 * A profile composed in a YAML config file, used by a real server (in-process `startServer`
 * over the file's config, real simulated engines publishing KV events over ZMQ, the openai
 * client), and the decisions debug endpoint with and without an API key.
 *
 * The file says `policy: round-robin` and composes a kv-aware mixed profile: the server starts
 * KV ingest because a scorer declares it needs the index (the old code compared the policy
 * name and ingested nothing for round-robin).
 */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { DecisionExplanation } from "../../../src/router/pipeline/types.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { configFromFile } from "../../../src/server/config.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../../src/util/log.ts";
import { kvEventsReceived, type SimProcess, simWorkerRecord, startSim } from "../../helpers/sim.ts";
import { waitFor } from "../../kv/fake-publisher.ts";

const BS = 16;
const MODEL = "sim-model";
const KEY = "debug-key";
const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();
const dir = mkdtempSync(join(tmpdir(), "infera-profiles-"));
let sims: SimProcess[] = [];
let server: InferaServer;

const doc = Array.from(
  { length: 40 },
  (_, i) => `Section ${i} of the pipeline notes covers stage ${i * 3}.`,
).join(" ");
const chat = (q: string) => [
  { role: "system" as const, content: doc },
  { role: "user" as const, content: q },
];

const YAML = `
policy: round-robin
scrapeIntervalMs: 0
apiKeys: [${KEY}]
# The whole prompt is scored even on a loaded box (the test checks promptBlocks): the default
# 100 ms of tokenizing can run out there, and routing then scores the prompt's head only.
promptBudgetMs: 5000
profiles:
  mixed:
    filters:
      - name: health
    scorers:
      - name: kv-prefix
        weight: 1
      - name: active-decode
        weight: 2
    picker:
      name: argmin
`;

before(async () => {
  sims = await Promise.all(
    ["p-a", "p-b"].map(() => startSim({ args: ["--block-size", String(BS), "--speed", "50"] })),
  );
  const file = join(dir, "infera.yaml");
  writeFileSync(file, YAML);
  const memory = new MemoryDiscovery(
    ["p-a", "p-b"].map((id, i) =>
      simWorkerRecord(sims[i]!, { id, model: MODEL, maxModelLen: 32768, blockSize: BS }),
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

test("a YAML-composed profile: its needs start KV ingest, and it routes to the cached prefix", async () => {
  assert.equal(server.config.policy, "round-robin");
  assert.ok(server.scheduling.needs.has("kvIndex"));
  assert.ok(server.kvIngest, "KV ingest started from the profile's needs");
  assert.deepEqual(
    server.scheduling.profiles.mixed.scorers.map((s) => [s.name, s.weight]),
    [
      ["kv-prefix", 1],
      ["active-decode", 2],
    ],
  );
  const index = server.kvIngest!.indexFor(MODEL)!;
  await kvEventsReceived(sims[1]!, () => index.blockCount("p-b") > 0, { what: "p-b's KV events" });
  // Cache the document on p-b only (straight to its engine).
  const warm = await fetch(`${sims[1]!.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: chat("warm"), max_tokens: 2 }),
  });
  assert.equal(warm.status, 200, await warm.text());
  const tokens = tok.encode(tok.applyChatTemplate(chat("q")));
  await waitFor(() => index.overlaps(tokens, ["p-a", "p-b"])[1]! > 10, 5000, "p-b indexed");
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  for (const q of ["q1", "q2", "q3"]) {
    const res = await client.chat.completions.create({ model: MODEL, messages: chat(q), max_tokens: 2 });
    assert.ok((res.usage?.prompt_tokens_details?.cached_tokens ?? 0) > 10 * BS, "a prefix hit on p-b");
  }
  const decisions = (await (
    await fetch(`${server.url}/debug/decisions?model=${MODEL}&limit=3`, {
      headers: { authorization: `Bearer ${KEY}` },
    })
  ).json()) as { data: DecisionExplanation[] };
  assert.equal(decisions.data.length, 3);
  for (const d of decisions.data) {
    assert.equal(d.step, "mixed");
    assert.equal(d.model, MODEL);
    assert.equal(d.winner, "p-b");
    assert.equal(d.reason, "overlap");
    assert.deepEqual(
      d.candidates.map((c) => c.worker),
      ["p-a", "p-b"],
    );
    for (const c of d.candidates) {
      assert.deepEqual(Object.keys(c.scores), ["kv-prefix", "active-decode"]);
      assert.equal(c.total, c.scores["kv-prefix"]! + c.scores["active-decode"]!);
    }
    const [a, b] = d.candidates;
    assert.ok(b!.scores["kv-prefix"]! < a!.scores["kv-prefix"]!, "p-b has fewer blocks to prefill");
    // The absolute overlap the step's overlap source counted, per candidate: p-a never saw the
    // document, p-b holds more than ten of its blocks; the prompt's full blocks at 16 tokens.
    // kv-prefix (weight 1) is exactly the uncached rest.
    const promptBlocks = Math.floor(tokens.length / BS);
    assert.equal(a!.cachedBlocks, 0);
    assert.ok((b!.cachedBlocks ?? 0) > 10, JSON.stringify(b));
    for (const c of d.candidates) {
      assert.equal(c.promptBlocks, promptBlocks);
      assert.equal(c.scores["kv-prefix"], c.promptBlocks! - c.cachedBlocks!);
    }
  }
});

test("GET /debug/decisions needs the API key when keys are set", async () => {
  const none = await fetch(`${server.url}/debug/decisions`);
  assert.equal(none.status, 401);
  const body = (await none.json()) as { error: { message: string } };
  assert.ok(body.error.message.length > 0, "an OpenAI-shaped error");
  const wrong = await fetch(`${server.url}/debug/decisions`, { headers: { authorization: "Bearer nope" } });
  assert.equal(wrong.status, 401);
  const ok = await fetch(`${server.url}/debug/decisions`, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(ok.status, 200);
  const post = await fetch(`${server.url}/debug/decisions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}` },
  });
  assert.equal(post.status, 405);
});

test("GET /debug/decisions is open when no API keys are set; round-robin decisions explain themselves", async () => {
  const memory = new MemoryDiscovery(
    ["o-a", "o-b"].map((id, i) =>
      simWorkerRecord(sims[i]!, { id, model: MODEL, maxModelLen: 32768, blockSize: BS }),
    ),
  );
  const open = await startServer(
    { host: "127.0.0.1", port: 0, scrapeIntervalMs: 0, router: "mixed" },
    { discovery: memory, logger },
  );
  try {
    assert.equal(open.kvIngest, null, "round-robin needs no KV index");
    assert.equal(open.scheduling.needs.size, 0, "nor tokens, load or a tree over mixed workers");
    const client = new OpenAI({ baseURL: `${open.url}/v1`, apiKey: "x", maxRetries: 0 });
    for (let i = 0; i < 2; i++)
      await client.completions.create({ model: MODEL, prompt: "hi", max_tokens: 1 });
    const r = await fetch(`${open.url}/debug/decisions`);
    assert.equal(r.status, 200);
    const { data } = (await r.json()) as { data: DecisionExplanation[] };
    assert.deepEqual(
      data.map((d) => [d.winner, d.reason]),
      [
        ["o-a", "round-robin"],
        ["o-b", "round-robin"],
      ],
    );
    // Round-robin reads no overlap: the decision says so (null), not a made-up 0.
    for (const d of data)
      for (const c of d.candidates) {
        assert.equal(c.cachedBlocks, null);
        assert.equal(c.promptBlocks, null);
      }
  } finally {
    await open.close();
  }
});

test("a bad profile or an unknown policy option is refused with its path before the server starts", async () => {
  const file = join(dir, "bad.yaml");
  writeFileSync(
    file,
    `profiles:\n  prefill:\n    scorers:\n      - {name: kv-prefix, weight: 1}\n      - {name: engine-queue, weight: heavy}\n    picker: {name: argmin}\n`,
  );
  await assert.rejects(
    async () =>
      startServer({ ...configFromFile(file), port: 0 }, { discovery: new MemoryDiscovery([]), logger }),
    // The file layer's schema refuses it and names the layer: --config <file>: <path>.
    /--config \S*bad\.yaml: profiles\.prefill\.scorers\[1\]\.weight/,
  );
  writeFileSync(file, `profiles:\n  decode:\n    picker: {name: argmin, params: {temprature: 1}}\n`);
  await assert.rejects(
    async () =>
      startServer({ ...configFromFile(file), port: 0 }, { discovery: new MemoryDiscovery([]), logger }),
    /profiles\.decode\.picker\.params.*temprature/,
  );
  writeFileSync(file, `profiles:\n  mixed:\n    picker: {name: no-such-picker}\n`);
  await assert.rejects(
    async () =>
      startServer({ ...configFromFile(file), port: 0 }, { discovery: new MemoryDiscovery([]), logger }),
    /profiles\.mixed\.picker\.name: unknown picker 'no-such-picker'/,
  );
  await assert.rejects(
    startServer(
      { port: 0, policy: "kv-aware", policyOptions: { overlapWieght: 2 } },
      { discovery: new MemoryDiscovery([]), logger },
    ),
    /unknown policy option 'overlapWieght'/,
  );
});
