import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { arrivalSchedule } from "../../src/loadgen/runner.ts";
import { buildWorkload, parseWorkloadName } from "../../src/loadgen/workloads/index.ts";
import { BadRequestError } from "../../src/protocol/errors.ts";

describe("workloads are seeded and reproducible", () => {
  for (const kind of ["synthetic", "multi-turn", "doc-qa"] as const) {
    it(`${kind}: same seed → identical requests, other seed → different`, () => {
      const a = buildWorkload({ kind }, 30, 7);
      const b = buildWorkload({ kind }, 30, 7);
      const c = buildWorkload({ kind }, 30, 8);
      assert.equal(a.length, 30);
      assert.equal(JSON.stringify(a), JSON.stringify(b));
      assert.notEqual(JSON.stringify(a), JSON.stringify(c));
    });
  }

  it("synthetic prompt lengths stay in the range (one filler word per token)", () => {
    const reqs = buildWorkload({ kind: "synthetic", inputLen: [10, 20] }, 50, 1, 16);
    for (const r of reqs) {
      const n = r.messages?.[0].content.split(" ").length ?? 0;
      assert.ok(n >= 10 && n <= 20, `length ${n}`);
      assert.equal(r.maxTokens, 16);
    }
  });

  it("arrival schedule: same seed, same times; mean gap close to 1/rate", () => {
    const reqs = buildWorkload({ kind: "synthetic" }, 2000, 3);
    const s1 = arrivalSchedule(reqs, 50, 3);
    assert.deepEqual(s1, arrivalSchedule(reqs, 50, 3));
    const meanGap = s1[s1.length - 1] / s1.length;
    assert.ok(Math.abs(meanGap - 20) < 2, `mean gap ${meanGap} ms`);
    assert.ok(s1.every((t, i) => i === 0 || t >= s1[i - 1]));
    assert.deepEqual(arrivalSchedule(reqs.slice(0, 3), undefined, 3), [0, 0, 0]);
  });
});

describe("multi-turn", () => {
  const reqs = buildWorkload({ kind: "multi-turn", systemPrompts: 2, turns: 3 }, 12, 5, 8);

  it("each turn holds the previous history and waits for the previous turn", () => {
    // 4 conversations × 3 turns, interleaved: request i's previous turn is i - 4.
    for (const r of reqs) {
      const msgs = r.messages ?? [];
      if (r.index < 4) {
        assert.equal(r.after, undefined);
        assert.equal(msgs.length, 2);
        continue;
      }
      const prev = reqs[r.index - 4];
      assert.equal(r.after, prev.index);
      assert.equal(r.group, prev.group);
      const prevMsgs = prev.messages ?? [];
      assert.deepEqual(msgs.slice(0, prevMsgs.length), prevMsgs);
      assert.equal(msgs[prevMsgs.length].role, "assistant");
      assert.equal(msgs[prevMsgs.length].content.split(" ").length, 8); // stand-in of max_tokens words
      assert.equal(msgs.length, prevMsgs.length + 2);
    }
  });

  it("conversations share at most the configured number of system prompts", () => {
    const systems = new Set(reqs.map((r) => r.messages?.[0].content));
    assert.ok(systems.size <= 2 && systems.size >= 1);
  });

  it("actual-reply mode points each assistant message at the request that produced it", () => {
    const act = buildWorkload({ kind: "multi-turn", turns: 3, replies: "actual" }, 6, 5, 8);
    // 2 conversations; request 4 is conversation 0's third turn: replies of requests 0 and 2.
    assert.deepEqual(act[4].replyRefs, [
      { messageIndex: 2, requestIndex: 0 },
      { messageIndex: 4, requestIndex: 2 },
    ]);
  });
});

describe("doc-qa", () => {
  it("requests over the same document share the document as a prefix", () => {
    const reqs = buildWorkload({ kind: "doc-qa", documents: 3, docLen: 200 }, 40, 2);
    const byDoc = new Map<string, string[]>();
    for (const r of reqs) {
      const u = r.messages?.[1].content ?? "";
      const doc = u.slice(0, u.indexOf("\n\nQuestion:"));
      const list = byDoc.get(r.group ?? "") ?? [];
      list.push(doc);
      byDoc.set(r.group ?? "", list);
    }
    assert.ok(byDoc.size <= 3 && byDoc.size >= 2);
    for (const docs of byDoc.values()) assert.equal(new Set(docs).size, 1);
  });
});

describe("JSONL traces", () => {
  it("reads messages, prompts, timestamps and passes extra fields through", () => {
    const dir = mkdtempSync(join(tmpdir(), "bench-trace-"));
    const path = join(dir, "t.jsonl");
    writeFileSync(
      path,
      [
        JSON.stringify({
          timestamp_ms: 1000,
          messages: [{ role: "user", content: "hi" }],
          max_tokens: 5,
          cache_salt: "t1",
        }),
        "",
        JSON.stringify({ timestamp_ms: 1250, prompt: "hello", max_tokens: 7 }),
        JSON.stringify({ timestamp: 1900, input_length: 600, output_length: 9, hash_ids: [11, 12] }),
        JSON.stringify({ timestamp: 2000, input_length: 100, output_length: 9, hash_ids: [11] }),
      ].join("\n"),
    );
    const spec = parseWorkloadName(path);
    assert.equal(spec.kind, "trace");
    const reqs = buildWorkload(spec, 10, 0);
    assert.equal(reqs.length, 4);
    assert.deepEqual(
      reqs.map((r) => r.arrivalMs),
      [0, 250, 900, 1000],
    );
    assert.deepEqual(
      reqs.map((r) => r.maxTokens),
      [5, 7, 9, 9],
    );
    assert.deepEqual(reqs[0].extraBody, { cache_salt: "t1" });
    assert.equal(reqs[2].prompt?.split(" ").length, 600);
    // Shared hash id → shared prefix block.
    assert.ok(reqs[2].prompt?.startsWith(reqs[3].prompt ?? "x"));
    assert.equal(buildWorkload(spec, 2, 0).length, 2);
  });

  it("rejects a bad line with its line number", () => {
    assert.throws(
      () => buildWorkload({ kind: "trace", lines: ['{"prompt":"a"}', "{oops"] }, 5, 0),
      (e: unknown) => e instanceof BadRequestError && /line 2/.test(e.message),
    );
    assert.throws(() => buildWorkload({ kind: "trace", lines: ['{"x":1}'] }, 5, 0), BadRequestError);
    assert.throws(() => parseWorkloadName("nonsense"), BadRequestError);
  });
});
