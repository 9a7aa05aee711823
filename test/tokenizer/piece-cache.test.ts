/**
 * The piece cache in front of gpt-tokenizer (src/tokenizer/piece-cache.ts) must give exactly the
 * ids gpt-tokenizer's own `encode` gives: the router's block hashes depend on them. Compared on
 * text chosen to stress the split regex (contractions, digit runs, whitespace before letters and
 * at the end, newlines, symbols, scripts without spaces, emoji, special-token strings), on
 * random strings, and with a capacity small enough that the generations turn over.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import gptApi, { encode } from "gpt-tokenizer";
import { PieceCache, pieceEncoder } from "../../src/tokenizer/piece-cache.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { Mulberry32 } from "../../src/util/mulberry32.ts";

const reference = (text: string) => encode(text, { disallowedSpecial: new Set() });

const SAMPLES = [
  "",
  "Hello world, it's 12345678 o'clock; they'LL've DONE it. I'm sure we'd go.",
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
  "  leading spaces, trailing spaces   ",
  "tabs\tand\t\ttabs \t mixed\r\nwindows\r\n\r\nlines\n\n\n",
  "a  b   c    d\n  e",
  "ünïcödé façade — naïve café «quoted» ‘single’ “double”",
  "日本語のテキストと中文文本，한국어 텍스트도 있습니다。",
  "emoji 🎉🎉🎉 👩‍👩‍👧 flags 🇫🇷 and ZWJ",
  "code: for (let i = 0; i < n; i++) { out[i] = a?.b ?? c; } // x=>y <= >= !== ===",
  "numbers 3.14159 1,000,000 0x1F 1e-9 2026-12-05T06:00:00Z",
  "x".repeat(300),
  " ".repeat(40) + "word",
  "$$$%%%^^^&&&***((()))",
];

test("the piece cache encodes exactly as gpt-tokenizer does, hits and misses alike", () => {
  const cache = pieceEncoder(gptApi);
  assert.ok(cache, "gpt-tokenizer's per-piece encoder has the shape piece-cache.ts expects");
  for (let round = 0; round < 2; round++)
    for (const s of SAMPLES) assert.deepEqual(cache.encode(s), reference(s), JSON.stringify(s));
  // The tokenizer the server and the sim use goes through it.
  for (const s of SAMPLES) assert.deepEqual(getDefaultTokenizer().encode(s), reference(s));
});

test("random text through a tiny cache (generations turning over) still matches", () => {
  const core = (
    gptApi as unknown as { bytePairEncodingCoreProcessor: ConstructorParameters<typeof PieceCache>[0] }
  ).bytePairEncodingCoreProcessor;
  const cache = new PieceCache(core, 8);
  const rand = new Mulberry32(7);
  const alphabet = [..."abcXYZ 019'\n\t.,!?-_é日😀"];
  for (let k = 0; k < 300; k++) {
    let s = "";
    const len = Math.floor(rand.next() * 60);
    for (let i = 0; i < len; i++) s += alphabet[Math.floor(rand.next() * alphabet.length)];
    assert.deepEqual(cache.encode(s), reference(s), JSON.stringify(s));
  }
});

test("an encoder without the expected internals is refused, so the caller falls back", () => {
  assert.equal(pieceEncoder({}), null);
  assert.equal(pieceEncoder(null), null);
  // A split regex without the global flag could not be iterated with exec.
  const core = { tokenSplitRegex: /x/u, getBpeRankFromString: () => 1, bytePairEncode: () => [1] };
  assert.equal(pieceEncoder({ bytePairEncodingCoreProcessor: core }), null);
});
