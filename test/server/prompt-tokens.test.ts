/**
 * Bounded routing tokenization (issue #17 item 1): a pathological prompt costs linear time,
 * long prompts are tokenized in slices that let the event loop run, and ordinary text gets the
 * same ids piece by piece as in one call (so block hashes still match the engine's).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import {
  ROUTING_TEXT_CAP,
  ROUTING_TOKEN_CAP,
  tokenizeBounded,
  tokenizeBoundedSync,
} from "../../src/server/prompt-tokens.ts";
import { ServerRoutingRequest } from "../../src/server/routing-request.ts";
import { getDefaultTokenizer, loadTokenizer } from "../../src/tokenizer/tokenizer.ts";

const tok = getDefaultTokenizer();
const NO_BUDGET = Number.POSITIVE_INFINITY;

function randomCjk(n: number): string {
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCharCode(0x4e00 + ((i * 7919) % 20_000));
  return s;
}

describe("routing tokenization is bounded", () => {
  it("ordinary text: the same ids piece by piece as in one call", () => {
    const words = [
      "the",
      "quick",
      "brown",
      "don't",
      "it's",
      "12345",
      "foo_bar",
      "<|im_start|>",
      "\n",
      "  ",
      "，",
      "你好世界",
      "naïve",
      "😀",
      "...",
      "x=1;",
    ];
    let x = 7;
    for (let trial = 0; trial < 50; trial++) {
      let s = "";
      while (s.length < 4000) {
        x = (x * 1103515245 + 12345) % 2147483648;
        s += words[x % words.length];
        if (x % 3 !== 0) s += " ";
      }
      // No budget: this checks the pieces, not the box's speed (a loaded box ran out of 100 ms).
      assert.deepEqual(tokenizeBoundedSync(tok, s, false, NO_BUDGET).ids, tok.encode(s));
    }
  });

  it("a 200 k-character single word and 100 k random CJK characters: bounded time and ids", () => {
    for (const content of ["a".repeat(200_000), randomCjk(100_000)]) {
      const t0 = performance.now();
      const req = new ServerRoutingRequest(
        "r",
        "m",
        "chat",
        { messages: [{ role: "user", content }] },
        false,
        undefined,
        tok,
      );
      const ids = req.promptTokens();
      const ms = performance.now() - t0;
      // Before: 26 s and 52 s. The routing budget is 100 ms of tokenizing; allow for a loaded machine.
      assert.ok(ms < 2000, `${ms} ms`);
      assert.ok(ids.length > 0 && ids.length <= ROUTING_TOKEN_CAP);
      assert.ok(req.promptText().length <= ROUTING_TEXT_CAP);
    }
  });

  it("prepare() lets the event loop run while a long prompt is tokenized", async () => {
    const req = new ServerRoutingRequest(
      "r",
      "m",
      "chat",
      { messages: [{ role: "user", content: randomCjk(60_000) }] },
      false,
      undefined,
      tok,
    );
    const pending = req.prepare();
    assert.ok(pending, "a long prompt is prepared ahead");
    await pending;
    assert.ok(req.promptTokens().length > 0);
    // The slicing itself, with a budget large enough that a loaded machine cannot end it early.
    let turns = 0;
    let stop = false;
    const spin = () => {
      turns++;
      if (!stop) setImmediate(spin);
    };
    setImmediate(spin);
    const r = await tokenizeBounded(tok, randomCjk(60_000), false, 60_000);
    stop = true;
    assert.ok(r.complete);
    assert.ok(turns > 1, `the event loop ran ${turns} times while tokenizing`);
  });

  it("an HF byte-level BPE with a BOS post-processor: the same ids piece by piece, BOS once", async () => {
    const dir = mkdtempSync(join(tmpdir(), "infera-pt-hf-"));
    try {
      // A minimal GPT-2-style tokenizer.json (byte-level, a few merges) with Llama 3's BOS template.
      const bs: number[] = [];
      for (let b = 33; b <= 126; b++) bs.push(b);
      for (let b = 161; b <= 172; b++) bs.push(b);
      for (let b = 174; b <= 255; b++) bs.push(b);
      const cs = [...bs];
      let n = 0;
      for (let b = 0; b < 256; b++)
        if (!bs.includes(b)) {
          bs.push(b);
          cs.push(256 + n++);
        }
      const vocab: Record<string, number> = {};
      bs.forEach((b, i) => {
        vocab[String.fromCodePoint(cs[i]!)] = b;
      });
      const merges = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at", "Ġ s", "a y"];
      let next = 256;
      for (const m of merges) vocab[m.replace(" ", "")] = next++;
      vocab["<|begin_of_text|>"] = 300;
      const bos = { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } };
      writeFileSync(
        join(dir, "tokenizer.json"),
        JSON.stringify({
          version: "1.0",
          truncation: null,
          padding: null,
          added_tokens: [
            {
              id: 300,
              content: "<|begin_of_text|>",
              single_word: false,
              lstrip: false,
              rstrip: false,
              normalized: false,
              special: true,
            },
          ],
          normalizer: null,
          pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
          post_processor: {
            type: "TemplateProcessing",
            single: [bos, { Sequence: { id: "A", type_id: 0 } }],
            pair: [bos, { Sequence: { id: "A", type_id: 0 } }, bos, { Sequence: { id: "B", type_id: 1 } }],
            special_tokens: {
              "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [300], tokens: ["<|begin_of_text|>"] },
            },
          },
          decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
          model: {
            type: "BPE",
            dropout: null,
            unk_token: null,
            fuse_unk: false,
            byte_fallback: false,
            vocab,
            merges,
          },
        }),
      );
      writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: "<|begin_of_text|>" }));
      const hf = await loadTokenizer(dir);
      const text = "the cat say, the cat's hat... 123abc  the\nsay ".repeat(200);
      assert.deepEqual(tokenizeBoundedSync(hf, text, true, NO_BUDGET).ids, hf.encode(text, true));
      assert.deepEqual(tokenizeBoundedSync(hf, text, false, NO_BUDGET).ids, hf.encode(text, false));
      assert.equal(tokenizeBoundedSync(hf, text, true, NO_BUDGET).ids.filter((id) => id === 300).length, 1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("short prompts keep the exact one-call path", () => {
    const req = new ServerRoutingRequest(
      "r",
      "m",
      "completion",
      { prompt: "Once upon a time" },
      false,
      undefined,
      tok,
    );
    assert.equal(req.prepare(), null);
    assert.deepEqual(req.promptTokens(), tok.encode("Once upon a time"));
  });
});
