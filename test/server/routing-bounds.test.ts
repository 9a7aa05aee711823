/**
 * What routing does on the event loop per request is bounded whatever the prompt (issue #17
 * item 1): a word without breaks is cut into short tokenizer pieces, and content parts past
 * the routing cap are neither read nor joined.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BodyParserPool, longStringHead } from "../../src/server/body-parser-pool.ts";
import {
  capText,
  PIECE_CHARS,
  pieceEnd,
  ROUTING_TEXT_CAP,
  WORD_CUT_CHARS,
} from "../../src/server/prompt-tokens.ts";
import { ServerRoutingRequest } from "../../src/server/routing-request.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";

const tok = getDefaultTokenizer();

function randomCjk(n: number): string {
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCharCode(0x4e00 + ((i * 7919) % 20_000));
  return s;
}

const chat = (content: unknown) =>
  new ServerRoutingRequest(
    "r",
    "m",
    "chat",
    { messages: [{ role: "user", content }] },
    false,
    undefined,
    tok,
  );

describe("tokenizer pieces", () => {
  it("a word with no break is cut every WORD_CUT_CHARS characters", () => {
    assert.equal(WORD_CUT_CHARS, 128);
    const cjk = randomCjk(2000);
    assert.equal(pieceEnd(cjk, 0), WORD_CUT_CHARS);
    assert.equal(pieceEnd(cjk, 300), 300 + WORD_CUT_CHARS);
    assert.equal(pieceEnd("a".repeat(5000), 0), WORD_CUT_CHARS);
    // Not inside a surrogate pair: from 1 (a low surrogate), 1 + 128 would split the 65th pair.
    assert.equal(pieceEnd("😀".repeat(1000), 1), WORD_CUT_CHARS);
  });

  it("ordinary text is still cut at the last word end of a whole piece", () => {
    const text = "lorem ipsum dolor ".repeat(100);
    const end = pieceEnd(text, 0);
    assert.ok(end > PIECE_CHARS - 20 && end <= PIECE_CHARS, `${end}`);
    assert.equal(text[end], " ");
  });
});

describe("content parts", () => {
  it("parts past the routing cap are never read", () => {
    const trap = {
      type: "text",
      get text(): string {
        throw new Error("a part past the cap was read");
      },
    };
    const req = chat([{ type: "text", text: "x".repeat(ROUTING_TEXT_CAP + 10) }, trap]);
    const text = req.promptText();
    assert.ok(text.length <= ROUTING_TEXT_CAP && text.length > ROUTING_TEXT_CAP - 100);
  });

  it("the head of several parts is the head of their joined text", () => {
    const a = "alpha ".repeat(7000);
    const b = "beta ".repeat(9000);
    const parts = [
      { type: "text", text: a },
      { type: "image_url", image_url: { url: "data:," } },
      { type: "text", text: b },
    ];
    const want = capText(tok.applyChatTemplate([{ role: "user", content: a + b }]));
    assert.equal(chat(parts).promptText(), want);
    // Under the cap: the parts are rendered whole, as before.
    const short = [
      { type: "text", text: "hello " },
      { type: "text", text: "world" },
    ];
    assert.equal(chat(short).promptText(), tok.applyChatTemplate([{ role: "user", content: "hello world" }]));
  });
});

describe("the boundary search", () => {
  it("classifies ASCII and CJK as the word regex does, without it", () => {
    // pieceEnd's word test: a boundary is a non-word character after a word character.
    const WORD = /[\p{L}\p{M}\p{N}'’]/u;
    for (let c = 0; c < 0xa000; c++) {
      if (c >= 0xd800 && c < 0xe000) continue;
      if (c >= 0x80 && c < 0x4e00) continue;
      const ch = String.fromCharCode(c);
      // "x…x" + ch + "…": a boundary at 300 exactly when ch is not a word character.
      const text = `${"x".repeat(300)}${ch}${"y".repeat(400)}`;
      const want = WORD.test(ch) ? WORD_CUT_CHARS : 300;
      assert.equal(pieceEnd(text, 0), want, `U+${c.toString(16)}`);
    }
  });

  it("cutting 64 k characters of one word into pieces takes well under a millisecond per piece", () => {
    const cjk = randomCjk(64_000);
    let best = Number.POSITIVE_INFINITY;
    let pieces = 0;
    for (let k = 0; k < 5; k++) {
      const t0 = performance.now();
      pieces = 0;
      for (let at = 0; at < cjk.length; at = pieceEnd(cjk, at)) pieces++;
      best = Math.min(best, performance.now() - t0);
    }
    assert.ok(pieces > (64_000 - PIECE_CHARS) / WORD_CUT_CHARS, `${pieces} pieces`);
    // ~0.3 ms with the fast path; the regex per character took ~15 ms (30 µs a piece).
    assert.ok(best < 5, `${best.toFixed(2)} ms for ${pieces} pieces`);
  });
});

describe("large bodies parsed off the loop", () => {
  it("the head kept for routing is at most one piece past the cap, also per content part", async () => {
    const pool = new BodyParserPool({ workers: 1 });
    try {
      const big = "a".repeat(ROUTING_TEXT_CAP * 2);
      const body = {
        model: "m",
        messages: [
          { role: "system", content: big },
          { role: "user", content: [{ type: "text", text: big }] },
        ],
      };
      const got = (await pool.parse(Buffer.from(JSON.stringify(body)))).value as {
        messages: [{ content: string }, { content: [object] }];
      };
      const heads = [
        longStringHead(got.messages[0], "content"),
        longStringHead(got.messages[1].content[0], "text"),
      ];
      for (const head of heads) {
        assert.ok(head !== undefined, "a head was kept");
        // Before: whole 64 KiB decode pieces were appended (131 072 characters here).
        assert.ok(head.length <= ROUTING_TEXT_CAP + PIECE_CHARS, `${head.length}`);
        assert.ok(head.length >= ROUTING_TEXT_CAP);
      }
      const req = new ServerRoutingRequest(
        "r",
        "m",
        "chat",
        { messages: [got.messages[1]] },
        false,
        undefined,
        tok,
      );
      assert.equal(req.promptText(), capText(tok.applyChatTemplate([{ role: "user", content: big }])));
    } finally {
      await pool.close();
    }
  });
});

describe("token-id prompts", () => {
  it("the text of a long token-id prompt is decoded in chunks within the budget", () => {
    const ids = tok.encode("the quick brown fox jumps over the lazy dog. ".repeat(8000));
    assert.ok(ids.length > 50_000);
    let calls = 0;
    let slow = false;
    const counting = {
      ...tok,
      decode: (x: readonly number[]) => {
        calls++;
        if (slow) {
          const t0 = performance.now();
          while (performance.now() - t0 < 5);
        }
        return tok.decode(x);
      },
    };
    const req = (budgetMs: number) =>
      new ServerRoutingRequest("r", "m", "completion", { prompt: ids }, false, undefined, counting, {
        budgetMs,
        cache: null,
      });
    // Within the budget: the whole text, chunk by chunk.
    assert.equal(req(10_000).promptText(), capText(tok.decode(ids)));
    assert.ok(calls > 10, `${calls} decode calls`);
    // A slow decoder (5 ms a chunk) and a 12 ms budget: the head's text only, never a long stall.
    slow = true;
    calls = 0;
    const head = req(12).promptText();
    assert.ok(calls >= 1 && calls <= 4, `${calls} decode calls`);
    assert.ok(tok.decode(ids).startsWith(head) && head.length < tok.decode(ids).length / 2);
  });
});
