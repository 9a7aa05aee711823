/**
 * The cache of earlier prompts' token ids by text prefix (issue #28 item 4): a conversation's
 * next turn reuses its history's ids, and whatever the new text, the ids are exactly those of
 * tokenizing it without the cache (so the router's block hashes still match the engine's, which
 * tokenizes the whole text in one call).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Prng, words } from "../../src/loadgen/prng.ts";
import { tokenizeBoundedSync } from "../../src/server/prompt-tokens.ts";
import { ServerRoutingRequest } from "../../src/server/routing-request.ts";
import { TokenPrefixCache } from "../../src/server/token-prefix-cache.ts";
import { getDefaultTokenizer, type Tokenizer } from "../../src/tokenizer/tokenizer.ts";

const tok = getDefaultTokenizer();
const NO_BUDGET = Number.POSITIVE_INFINITY;

/** The built-in vocabulary with a BOS (id 999999) as a post-processor would add it. */
const withBos: Tokenizer = {
  id: "bos",
  eosTokenId: null,
  encode: (text, add = false) => (add ? [999999, ...tok.encode(text)] : tok.encode(text)),
  decode: (ids) => tok.decode(ids.filter((id) => id !== 999999)),
  applyChatTemplate: (m) => tok.applyChatTemplate(m),
};

/** Text with the shapes that decide piece ends: words, punctuation, runs of spaces, long words, CJK. */
function mixed(rng: Prng, chars: number): string {
  const bits = [
    () => words(rng, rng.int(1, 30)),
    () => ", ",
    () => ".\n\n",
    () => "   ",
    () => "don't it's ",
    () => String(rng.int(0, 999999)),
    () => "x".repeat(rng.int(100, 900)),
    () => "中文测试你好世界".repeat(rng.int(1, 80)),
    () => "😀 naïve café ",
    () => "<|im_end|>\n<|im_start|>user\n",
  ];
  let s = "";
  while (s.length < chars) s += rng.pick(bits)();
  return s;
}

describe("token prefix cache", () => {
  it("a conversation's next turn reuses its history's ids: the same ids as the whole text", () => {
    const cache = new TokenPrefixCache();
    const rng = new Prng(28);
    const messages: { role: string; content: string }[] = [{ role: "system", content: words(rng, 2000) }];
    let previous = 0;
    for (let turn = 0; turn < 5; turn++) {
      messages.push({ role: "user", content: words(rng, 1500) });
      const text = tok.applyChatTemplate(messages);
      const before = cache.reusedTokens;
      const got = tokenizeBoundedSync(tok, text, false, NO_BUDGET, cache);
      assert.ok(got.complete);
      assert.deepEqual(got.ids, tok.encode(text), `turn ${turn}`);
      // All of the previous turn but its last piece or two (≈ 100–200 tokens of these words).
      if (turn > 0) assert.ok(cache.reusedTokens - before > previous - 300, `turn ${turn}`);
      previous = got.ids.length;
      messages.push({ role: "assistant", content: words(rng, 300) });
    }
    assert.equal(cache.hits, 4);
  });

  it("any edit of a cached text: exactly the ids of the new text, with and without a BOS", () => {
    const rng = new Prng(7);
    for (const [t, add] of [
      [tok, false],
      [withBos, true],
    ] as const) {
      const cache = new TokenPrefixCache();
      for (let trial = 0; trial < 120; trial++) {
        const a = mixed(rng, rng.int(600, 6000));
        tokenizeBoundedSync(t, a, add, NO_BUDGET, cache);
        // Keep a head of any length (also inside a word or a piece's look-ahead), add any tail.
        const b = a.slice(0, rng.int(0, a.length)) + (rng.next() < 0.8 ? mixed(rng, rng.int(0, 3000)) : "");
        const got = tokenizeBoundedSync(t, b, add, NO_BUDGET, cache);
        assert.deepEqual(got.ids, tokenizeBoundedSync(t, b, add, NO_BUDGET, null).ids, `trial ${trial}`);
        if (add && b.length > 0) assert.equal(got.ids.filter((id) => id === 999999).length, 1);
      }
      assert.ok(cache.hits > 30, `${cache.hits} hits`);
    }
  });

  it("memory is bounded by the ids held, least recently used out", () => {
    const cache = new TokenPrefixCache(20_000);
    const rng = new Prng(3);
    for (let i = 0; i < 30; i++) tokenizeBoundedSync(tok, words(rng, 3000), false, NO_BUDGET, cache);
    assert.ok(cache.size() <= 20_000 && cache.size() > 10_000, `${cache.size()}`);
    // A text longer than the whole cache is not kept (and does not empty it).
    tokenizeBoundedSync(tok, words(rng, 30_000), false, NO_BUDGET, cache);
    assert.ok(cache.size() > 10_000);
  });

  it("a superseded turn is dropped: one entry's worth per conversation", () => {
    const cache = new TokenPrefixCache();
    const rng = new Prng(5);
    let text = words(rng, 2000);
    for (let turn = 0; turn < 6; turn++) {
      tokenizeBoundedSync(tok, text, false, NO_BUDGET, cache);
      text += ` ${words(rng, 1000)}`;
    }
    // Six turns of 2–7 k tokens: only the last (≈ 7 k ids) is held, not their 27 k sum.
    assert.ok(cache.size() < 7500, `${cache.size()}`);
  });

  it("a budget overrun gives the head's ids, and the next request of that text continues it", () => {
    // A slow tokenizer (≈ 1 ms a piece) and a 15 ms budget: a 40 k-token prompt cannot be done at once.
    const slow: Tokenizer = {
      ...tok,
      id: "slow",
      encode: (text) => {
        const t0 = performance.now();
        while (performance.now() - t0 < 1);
        return tok.encode(text);
      },
    };
    const cache = new TokenPrefixCache();
    const text = words(new Prng(11), 40_000);
    const whole = tok.encode(text);
    const first = new ServerRoutingRequest(
      "r1",
      "m",
      "completion",
      { prompt: text },
      false,
      undefined,
      slow,
      {
        budgetMs: 15,
        cache,
      },
    );
    const ids = first.promptTokens();
    assert.ok(ids.length > 0 && ids.length < whole.length / 2, `${ids.length}`);
    assert.deepEqual(ids, whole.slice(0, ids.length), "a partial score, of the prompt's head");
    let got = ids.length;
    for (let k = 0; k < 400 && got < whole.length; k++) {
      // A completion adds special tokens (vLLM's rule), which is part of the cache key.
      const r = tokenizeBoundedSync(slow, text, true, 15, cache);
      assert.ok(r.ids.length > got, "each try continues where the last stopped");
      assert.deepEqual(r.ids, whole.slice(0, r.ids.length));
      got = r.ids.length;
    }
    assert.equal(got, whole.length);
  });
});

describe("token prefix cache and cache_salt", () => {
  it("a salted request neither reuses nor leaves ids in the cache", () => {
    const cache = new TokenPrefixCache();
    const text = words(new Prng(13), 3000);
    const make = (salt: string | undefined) =>
      new ServerRoutingRequest("r", "m", "completion", { prompt: text }, false, salt, tok, {
        budgetMs: NO_BUDGET,
        cache,
      });
    assert.deepEqual(make("tenant-a").promptTokens(), tok.encode(text));
    assert.equal(cache.size(), 0, "nothing kept from a salted prompt");
    make(undefined).promptTokens();
    assert.ok(cache.size() > 0);
    make("tenant-b").promptTokens();
    assert.equal(cache.hits, 0, "a salted prompt does not reuse another's ids");
  });
});
