/**
 * Bounded routing tokenization (issue #17 item 1): a pathological prompt costs linear time,
 * long prompts are tokenized in slices that let the event loop run, and ordinary text gets the
 * same ids piece by piece as in one call (so block hashes still match the engine's).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { getDefaultTokenizer } from "../../src/kv/tokenizer.ts";
import { ROUTING_TEXT_CAP, ROUTING_TOKEN_CAP, tokenizeBoundedSync } from "../../src/server/prompt-tokens.ts";
import { ServerRoutingRequest } from "../../src/server/routing-request.ts";

const tok = getDefaultTokenizer();

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
      assert.deepEqual(tokenizeBoundedSync(tok, s, false).ids, tok.encode(s));
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
    let turns = 0;
    let stop = false;
    const spin = () => {
      turns++;
      if (!stop) setImmediate(spin);
    };
    setImmediate(spin);
    const pending = req.prepare();
    assert.ok(pending, "a long prompt is prepared ahead");
    await pending;
    stop = true;
    assert.ok(turns > 1, `the event loop ran ${turns} times while tokenizing`);
    assert.ok(req.promptTokens().length > 0);
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
