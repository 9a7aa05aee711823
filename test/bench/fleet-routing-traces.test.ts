/**
 * bench/fleet-routing's trace replay pieces (issue #28 item 5): the traffic generators, the
 * trace's ideal reuse and fleet-wide LRU figures, and the load → time-scale rule.
 *
 * The Mooncake format: kvcache-ai/Mooncake FAST25-release/README.md @ 40ea55f8 (the two sample
 * lines below, verbatim) and FAST25-release/traces/conversation_trace.jsonl @ a2a4b18a:
 * `timestamp` in ms from the trace start, `input_length` tokens, one hash id per 512-token block
 * (ceil(input_length / 512) ids).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { generate, MOONCAKE_BLOCK, summarize, type TraceLine } from "../../bench/fleet-routing/generate.ts";
import { traceRequests } from "../../bench/fleet-routing/trace-run.ts";
import {
  loadAt,
  prefillSeconds,
  requestTokens,
  timeScaleForLoad,
  traceStats,
} from "../../bench/fleet-routing/trace-stats.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";

const MOONCAKE_SAMPLE = [
  '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}',
  '{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}',
];
const MODEL = { prefill_per_token_s: 8.3e-5, attention_per_token_ctx_s: 2.65e-9 };
const tok = getDefaultTokenizer();

describe("Mooncake trace lines as prompts", () => {
  it("shared hash ids give the same text; the prompt has input_length tokens (+ the chat template)", () => {
    const [a, b] = traceRequests(MOONCAKE_SAMPLE);
    assert.equal(b.arrivalMs, 30535 - 27482);
    assert.equal(a.maxTokens, 52);
    const ta = requestTokens(tok, a);
    const tb = requestTokens(tok, b);
    // ChatML around one user message adds a few tokens; the blocks' words are one token each.
    assert.ok(ta.length >= 6955 && ta.length < 6955 + 32, `${ta.length} tokens`);
    let same = 0;
    while (ta[same] === tb[same]) same++;
    // 12 shared ids = 6144 tokens of shared text after the template's opening, not one more block.
    assert.ok(same >= 12 * MOONCAKE_BLOCK && same < 13 * MOONCAKE_BLOCK, `${same} shared tokens`);
    const stats = traceStats([a, b], { tok, blockSize: 16, fleetBlocks: 10_000, model: MODEL });
    // b's reusable part: the shared prefix's whole 16-token blocks.
    assert.equal(stats.ideal.perRequest[1].reachable, Math.floor(same / 16) * 16);
    assert.equal(stats.ideal.perRequest[0].reachable, 0);
    assert.equal(stats.spanS, (30535 - 27482) / 1000);
  });

  it("caps max_tokens with maxOutput and keeps the prompt", () => {
    const [a] = traceRequests(MOONCAKE_SAMPLE, { maxOutput: 8 });
    assert.equal(a.maxTokens, 8);
    assert.equal(requestTokens(tok, a).length, requestTokens(tok, traceRequests(MOONCAKE_SAMPLE)[0]).length);
  });
});

describe("ideal reuse and the fleet-wide LRU", () => {
  const req = (arrivalMs: number, content: string) => ({
    index: 0,
    arrivalMs,
    maxTokens: 4,
    messages: [{ role: "user" as const, content }],
  });
  const text = (seed: string, n: number) => Array.from({ length: n }, (_, i) => `${seed}${i % 7}`).join(" ");
  it("an LRU smaller than the footprint forgets what the ideal cache keeps", () => {
    const a = text("apple", 400);
    const b = text("stone", 400);
    const reqs = [req(0, a), req(1000, b), req(2000, a)];
    const big = traceStats(reqs, { tok, blockSize: 16, fleetBlocks: 1_000_000, model: MODEL });
    assert.ok(big.ideal.perRequest[2].reachable > 0);
    assert.equal(big.lru.reachable, big.ideal.reachable);
    // Room for one prompt's blocks only: b evicts all of a before a comes back (two more blocks
    // and a's head would survive: its most recently touched).
    const perPrompt = Math.floor(requestTokens(tok, reqs[0]).length / 16);
    const small = traceStats(reqs, { tok, blockSize: 16, fleetBlocks: perPrompt, model: MODEL });
    assert.equal(small.ideal.reachable, big.ideal.reachable);
    assert.equal(small.lru.perRequest[2].reachable, 0);
    assert.equal(small.distinctBlocks, big.distinctBlocks);
  });

  it("evicts a prompt's tail before its head (vLLM frees blocks in reverse order)", () => {
    const shared = text("river", 320);
    const reqs = [req(0, `${shared} ${text("cloud", 320)}`), req(1, shared)];
    const n = Math.floor(requestTokens(tok, reqs[1]).length / 16);
    // The cache holds fewer blocks than the first prompt: its head survives, its tail does not.
    const s = traceStats(reqs, { tok, blockSize: 16, fleetBlocks: n + 4, model: MODEL });
    assert.ok(s.lru.perRequest[1].reachable >= (n - 2) * 16, JSON.stringify(s.lru.perRequest));
  });

  it("the time scale for a load is proportional to it, and loadAt inverts it", () => {
    const reqs = [req(0, text("apple", 500)), req(10_000, text("stone", 500))];
    const s = traceStats(reqs, { tok, blockSize: 16, fleetBlocks: 1000, model: MODEL });
    const tokens = s.ideal.perRequest.map((p) => p.prompt);
    assert.ok(Math.abs(s.prefillWorkS - tokens.reduce((x, t) => x + prefillSeconds(MODEL, t, 0), 0)) < 1e-9);
    const f = timeScaleForLoad(s, 8, 0.7);
    assert.ok(Math.abs(timeScaleForLoad(s, 8, 1.4) - 2 * f) < 1e-9);
    assert.ok(Math.abs(loadAt(s, 8, f) - 0.7) < 1e-9);
    // 0.7 × 8 workers' capacity over the 10 s span, scaled: work × F / span = 0.7 × 8.
    assert.ok(Math.abs((s.prefillWorkS * f) / 10 - 5.6) < 1e-9);
  });
});

describe("traffic generators", () => {
  const base = {
    seed: 7,
    sessions: 60,
    durationS: 30,
    tenants: 8,
    zipf: 1,
    preambleBlocks: 1,
    thinkS: 2,
  };
  const bySession = (lines: readonly TraceLine[]) => {
    const m = new Map<string, TraceLine[]>();
    for (const l of lines) {
      const k = l.group.replace(/\/turn-\d+$/, "");
      m.set(k, [...(m.get(k) ?? []), l]);
    }
    return m;
  };

  it("is seeded, sorted, and in Mooncake's shape", () => {
    const a = generate({ ...base, kind: "mix" });
    assert.deepEqual(a, generate({ ...base, kind: "mix" }));
    assert.notDeepEqual(a, generate({ ...base, kind: "mix", seed: 8 }));
    for (const [i, l] of a.entries()) {
      if (i > 0) assert.ok(l.timestamp >= a[i - 1].timestamp);
      assert.equal(l.hash_ids.length, Math.ceil(l.input_length / MOONCAKE_BLOCK));
      assert.ok(l.input_length <= 32768 && l.output_length > 0);
    }
  });

  it("chat: each turn re-sends the history and the previous answer, arriving soon after it", () => {
    const lines = generate({ ...base, kind: "chat" });
    let follow = 0;
    let soon = 0;
    for (const turns of bySession(lines).values())
      for (let t = 1; t < turns.length; t++) {
        const [p, q] = [turns[t - 1], turns[t]];
        follow++;
        // The previous prompt's blocks (the partial last one included) lead this one.
        assert.deepEqual(q.hash_ids.slice(0, p.hash_ids.length), p.hash_ids);
        assert.ok(q.input_length > p.input_length + p.output_length, "history + answer + new text");
        const gapS = (q.timestamp - p.timestamp) / 1000;
        assert.ok(gapS >= p.output_length * 0.02 - 0.001, "not before the answer's unloaded decode");
        if (gapS < p.output_length * 0.02 + 5) soon++;
      }
    assert.ok(follow > 30, `${follow} follow-up turns`);
    // Think times are short: most next turns come within 5 s of the answer's end.
    assert.ok(soon / follow > 0.8, `${soon}/${follow}`);
    // The replayed text of a follow-up starts with the whole previous prompt.
    const turns = [...bySession(lines).values()].find((x) => x.length > 2) ?? [];
    const [p, q] = traceRequests(turns.slice(0, 2).map((l) => JSON.stringify(l)));
    assert.ok(q.messages?.[0].content.startsWith(p.messages?.[0].content ?? "?"));
  });

  it("agents step fast with growing context; system prompts are long and shared; hot tenant", () => {
    const agent = generate({ ...base, kind: "agent" });
    const gaps: number[] = [];
    for (const turns of bySession(agent).values())
      for (let t = 1; t < turns.length; t++) gaps.push(turns[t].timestamp - turns[t - 1].timestamp);
    gaps.sort((x, y) => x - y);
    assert.ok(
      gaps[Math.floor(gaps.length / 2)] < 3000,
      `median agent gap ${gaps[Math.floor(gaps.length / 2)]} ms`,
    );
    const sys = generate({ ...base, kind: "system" });
    const firstIds = new Map<string, number[]>();
    for (const l of sys) {
      const tenant = l.group.split("/")[0];
      const prev = firstIds.get(tenant);
      // Every prompt of a tenant opens with the same ≥ 5 blocks (preamble + its system prompt).
      if (prev) assert.deepEqual(l.hash_ids.slice(0, 5), prev.slice(0, 5));
      else firstIds.set(tenant, l.hash_ids);
    }
    assert.ok(summarize(sys).idealReuse > 0.5);
    const hot = generate({ ...base, kind: "chat", sessions: 200, hot: 0.5 });
    const sessions = [...bySession(hot).keys()];
    const share = sessions.filter((k) => k.startsWith("tenant-0/")).length / sessions.length;
    assert.ok(share > 0.4 && share < 0.6, `hot share ${share}`);
  });

  it("a window keeps steady-state traffic from 0", () => {
    const all = generate({ ...base, kind: "chat" });
    const w = generate({ ...base, kind: "chat", window: [10, 20] });
    assert.ok(w.length > 0 && w.length < all.length);
    assert.ok(w.every((l) => l.timestamp >= 0 && l.timestamp < 10_000));
    assert.equal(w.length, all.filter((l) => l.timestamp >= 10_000 && l.timestamp < 20_000).length);
  });
});

describe("run.ts --trace end to end (2 engines, real servers)", () => {
  it("replays a Mooncake trace and an OpenAI one per policy and replica count, with the report", async () => {
    const { spawnSync } = await import("node:child_process");
    const { mkdtempSync, readFileSync, rmSync, writeFileSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { fileURLToPath } = await import("node:url");
    const dir = mkdtempSync(join(tmpdir(), "fleet-trace-e2e-"));
    try {
      const mooncake = join(dir, "chat.jsonl");
      // Three turns of one conversation: each re-sends the last one (shared ids → shared text),
      // 4 s apart at --speed 1 (a 1k-token prefill takes ~0.1 s), so each turn's blocks have
      // reached the index before the next even on a busy box.
      writeFileSync(
        mooncake,
        [
          { timestamp: 0, input_length: 700, output_length: 4, hash_ids: [1, 2] },
          { timestamp: 4000, input_length: 900, output_length: 4, hash_ids: [1, 2] },
          { timestamp: 8000, input_length: 1100, output_length: 4, hash_ids: [1, 2, 3] },
        ]
          .map((l) => JSON.stringify(l))
          .join("\n"),
      );
      const openai = join(dir, "openai.jsonl");
      const sys = { role: "system", content: text("policy", 300) };
      writeFileSync(
        openai,
        [0, 200, 400]
          .map((t, i) =>
            JSON.stringify({
              timestamp_ms: t,
              max_tokens: 3,
              messages: [sys, { role: "user", content: `q${i}` }],
            }),
          )
          .join("\n"),
      );
      const run = fileURLToPath(new URL("../../bench/fleet-routing/run.ts", import.meta.url));
      const r = spawnSync(
        process.execPath,
        [
          run,
          ...["--trace", `${mooncake},${openai}`, "--workers", "2", "--speed", "1", "--time-scale", "1"],
          ...["--policies", "kv-aware", "--replicas", "1,2", "--drain-s", "20", "--out", dir],
        ],
        { encoding: "utf8", timeout: 240_000 },
      );
      assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
      assert.match(
        r.stdout,
        /### chat\.jsonl: load [\d.]+× capacity, 2 workers; ideal reuse [\d.]+%, fleet-wide LRU/,
      );
      assert.match(r.stdout, /\| kv-aware × 2 \| [\d.]+% \| [\d.]+% \| [\d.]+% \|/);
      const res = JSON.parse(readFileSync(join(dir, "trace-results.json"), "utf8")) as {
        cases: Array<{ name: string; stats: { idealReuse: number } }>;
        runs: Array<{ case: string; policy: string; replicas: number; fig: { ok: number; hitRate: number } }>;
      };
      assert.equal(res.runs.length, 2 * 2);
      for (const x of res.runs) assert.equal(x.fig.ok, 3, `${x.case} ${x.policy}×${x.replicas}`);
      // The conversation's later turns re-send the first: more than half of its tokens reusable.
      const chat = res.cases.find((c) => c.name === "chat.jsonl");
      assert.ok((chat?.stats.idealReuse ?? 0) > 0.5, JSON.stringify(chat));
      const kv = res.runs.find((x) => x.case === "chat.jsonl" && x.policy === "kv-aware" && x.replicas === 1);
      assert.ok((kv?.fig.hitRate ?? 0) > 0.4, JSON.stringify(kv?.fig));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

function text(seed: string, n: number): string {
  return Array.from({ length: n }, (_, i) => `${seed}${i % 7}`).join(" ");
}

describe("generate.ts and goals.ts from the command line", () => {
  it("goals.ts --help prints its usage and starts nothing", async () => {
    const { spawnSync } = await import("node:child_process");
    const { fileURLToPath } = await import("node:url");
    const goals = fileURLToPath(new URL("../../bench/fleet-routing/goals.ts", import.meta.url));
    const out = spawnSync(process.execPath, [goals, "--help"], { encoding: "utf8", timeout: 60_000 });
    assert.equal(out.status, 0, out.stderr);
    assert.match(out.stdout, /^Issue #28's routing goals in one command/);
    assert.match(out.stdout, /\n {2}node bench\/fleet-routing\/goals\.ts \[--quick\]/);
    assert.doesNotMatch(out.stderr, /\[goals/);
  });

  it("generate.ts writes the seeded trace and prints its sanity summary", async () => {
    const { spawnSync } = await import("node:child_process");
    const { mkdtempSync, readFileSync, rmSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { fileURLToPath } = await import("node:url");
    const gen = fileURLToPath(new URL("../../bench/fleet-routing/generate.ts", import.meta.url));
    const dir = mkdtempSync(join(tmpdir(), "fleet-gen-"));
    try {
      const file = join(dir, "t.jsonl");
      const args = [
        gen,
        "--kind",
        "agent",
        "--seed",
        "3",
        "--sessions",
        "20",
        "--duration-s",
        "10",
        "--out",
        file,
      ];
      const out = spawnSync(process.execPath, args, { encoding: "utf8", timeout: 60_000 });
      assert.equal(out.status, 0, out.stderr);
      const lines = readFileSync(file, "utf8").trim().split("\n");
      assert.match(
        out.stdout,
        new RegExp(
          `${lines.length} requests in 20 sessions over \\d+ s; mean prompt \\d+ tokens, mean output \\d+; ideal reuse [\\d.]+%`,
        ),
      );
      const again = spawnSync(process.execPath, args, { encoding: "utf8", timeout: 60_000 });
      assert.equal(again.stdout, out.stdout);
      assert.deepEqual(Object.keys(JSON.parse(lines[0])).sort(), [
        "group",
        "hash_ids",
        "input_length",
        "output_length",
        "timestamp",
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
