/**
 * Tokens per millisecond of the router's prompt tokenizing, the built-in o200k tokenizer and the
 * HF tokenizer path (src/tokenizer/hf-tokenizer.ts, with o200k converted to a tokenizer.json by
 * ./o200k-hf.ts, so both give the same ids) side by side, on prompts of `--tokens` tokens:
 *
 * - `whole`: one `encode` of the whole text (what the sim, and an engine, do);
 * - `pieces`: the router's bounded path (src/server/prompt-tokens.ts: 512-character pieces cut
 *   at word ends), with no time budget, which is what the time budget is spent on;
 * - `hash`: the router's block hashes of those ids (src/kv/hash.ts, 16-token blocks);
 * - `bridge path`: the approximate tree's chunk path of the text (the pending bridge's key);
 * - `next turn`: a conversation's turn at ≈ `--tokens` after turns of ≈ 2 k tokens each, with and
 *   without the token prefix cache (src/server/token-prefix-cache.ts) holding the previous turn.
 *
 * Texts: `filler` (the bench workloads' common words, src/loadgen/prng.ts), `prose` (made-up words
 * of 2–12 letters with punctuation, numbers and newlines: few repeated words, so per-word caches
 * rarely hit) and `cjk` (random CJK ideographs, BPE's expensive case). Each text is new to the
 * tokenizer on its first (`cold`) run; `warm` is the median of the next `--runs`.
 *
 *   node bench/tokenizer/run.ts [--tokens 40000] [--runs 5]
 */
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ApproxPrefixTree } from "../../src/kv/approx-tree.ts";
import { hashPrompt } from "../../src/kv/hash.ts";
import { Prng, words } from "../../src/loadgen/prng.ts";
import { tokenizeBoundedSync } from "../../src/server/prompt-tokens.ts";
import { TokenPrefixCache } from "../../src/server/token-prefix-cache.ts";
import { getDefaultTokenizer, loadTokenizer, type Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { writeO200kHf } from "./o200k-hf.ts";

const { values } = parseArgs({
  options: { tokens: { type: "string", default: "40000" }, runs: { type: "string", default: "5" } },
});
const TOKENS = Number(values.tokens);
const RUNS = Number(values.runs);

function prose(rng: Prng, n: number): string {
  const letters = "abcdefghijklmnopqrstuvwxyz";
  let out = "";
  for (let i = 0; i < n; i++) {
    let w = "";
    const len = rng.int(2, 12);
    for (let j = 0; j < len; j++) w += letters[rng.int(0, 25)];
    if (rng.next() < 0.08) w = w[0]!.toUpperCase() + w.slice(1);
    if (rng.next() < 0.05) w = String(rng.int(0, 99999));
    out += w;
    const r = rng.next();
    out += r < 0.06 ? ". " : r < 0.1 ? ", " : r < 0.11 ? ".\n\n" : " ";
  }
  return out;
}

function cjk(rng: Prng, n: number): string {
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCharCode(0x4e00 + rng.int(0, 0x4fff));
  return s;
}

/** A text of about TOKENS tokens (cut to it by characters, measured with the built-in tokenizer). */
function sized(tok: Tokenizer, make: (rng: Prng, n: number) => string, seed: number): string {
  let text = make(new Prng(seed), TOKENS);
  const n = tok.encode(text).length;
  text = text.slice(0, Math.floor((text.length * TOKENS) / n));
  return tok.applyChatTemplate([{ role: "user", content: text }]);
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

function time(f: () => void): number {
  const t0 = performance.now();
  f();
  return performance.now() - t0;
}

/** Cold (first) and warm (median of RUNS) ms of `f` on fresh texts made by `text(seed)`. */
function measure(text: (seed: number) => string, f: (t: string) => void): { cold: number; warm: number } {
  const t = text(1000);
  const cold = time(() => f(t));
  const warm: number[] = [];
  for (let r = 0; r < RUNS; r++) warm.push(time(() => f(t)));
  return { cold, warm: median(warm) };
}

const builtin = getDefaultTokenizer();
const t0 = performance.now();
const hfDir = writeO200kHf(join(tmpdir(), "infera-bench-o200k-hf"));
const hf = await loadTokenizer(hfDir);
console.log(`# o200k → tokenizer.json + load: ${(performance.now() - t0).toFixed(0)} ms`);
console.log(
  `# ${TOKENS} tokens per prompt, ${RUNS} warm runs; load average ${(await import("node:os"))
    .loadavg()
    .map((x) => x.toFixed(2))
    .join(" ")}`,
);

const kinds: [string, (rng: Prng, n: number) => string][] = [
  ["filler", words],
  ["prose", prose],
  ["cjk", (rng, n) => cjk(rng, Math.ceil(n * 0.8))],
];
const fmt = (ms: number, n: number) =>
  `${ms.toFixed(1).padStart(7)} ms ${(n / ms).toFixed(0).padStart(6)} tok/ms`;
console.log("text    tokens  chars   tokenizer  path     cold                        warm");
let seed = 1;
for (const [kind, make] of kinds) {
  for (const [name, tok] of [
    ["built-in", builtin],
    ["hf", hf],
  ] as const) {
    const s0 = seed++;
    const text = sized(builtin, make, s0 * 7919);
    const n = builtin.encode(text).length;
    const fresh = (() => {
      let k = 0;
      // Each cold run needs a text new to the tokenizer's caches: a fresh seed each time.
      return () => (k++ === 0 ? text : sized(builtin, make, s0 * 7919 + k));
    })();
    const whole = measure(fresh, (t) => tok.encode(t));
    const pieces = measure(
      () => sized(builtin, make, s0 * 7919 + 500),
      (t) => tokenizeBoundedSync(tok, t, false, Number.POSITIVE_INFINITY),
    );
    const row = (path: string, m: { cold: number; warm: number }) =>
      console.log(
        `${kind.padEnd(7)} ${String(n).padStart(6)} ${String(text.length).padStart(7)}  ${name.padEnd(9)}  ${path.padEnd(7)} ${fmt(m.cold, n)}    ${fmt(m.warm, n)}`,
      );
    row("whole", whole);
    row("pieces", pieces);
  }
}
const ids = builtin.encode(sized(builtin, words, 42));
const text = sized(builtin, words, 42);
const hash = measure(
  () => "",
  () => hashPrompt(ids, 16),
);
const tree = new ApproxPrefixTree({ maxChars: Number.POSITIVE_INFINITY });
const path = measure(
  () => text,
  (t) => tree.path(t),
);
console.log(
  `hash ${ids.length} ids (16-token blocks): cold ${hash.cold.toFixed(2)} ms, warm ${hash.warm.toFixed(2)} ms`,
);
console.log(
  `bridge path of ${text.length} chars (64-char chunks): cold ${path.cold.toFixed(2)} ms, warm ${path.warm.toFixed(2)} ms`,
);

// A conversation's next turn: the history (≈ TOKENS) re-sent with a new question, prose text.
for (const [name, tok] of [
  ["built-in", builtin],
  ["hf", hf],
] as const) {
  const rng = new Prng(77);
  const messages: { role: string; content: string }[] = [];
  while (builtin.encode(builtin.applyChatTemplate(messages)).length < TOKENS - 2000) {
    messages.push(
      { role: "user", content: prose(rng, 200) },
      { role: "assistant", content: prose(rng, 1600) },
    );
  }
  const before = tok.applyChatTemplate(messages);
  messages.push({ role: "user", content: prose(rng, 200) });
  const turn = tok.applyChatTemplate(messages);
  // Median of RUNS, each with a cache holding just the previous turn.
  const withCache: number[] = [];
  const without: number[] = [];
  let reused = 0;
  for (let r = 0; r < RUNS; r++) {
    const cache = new TokenPrefixCache();
    tokenizeBoundedSync(tok, before, false, Number.POSITIVE_INFINITY, cache);
    withCache.push(time(() => tokenizeBoundedSync(tok, turn, false, Number.POSITIVE_INFINITY, cache)));
    reused = cache.reusedTokens;
    without.push(time(() => tokenizeBoundedSync(tok, turn, false, Number.POSITIVE_INFINITY, null)));
  }
  const cached = median(withCache);
  const plain = median(without);
  const n = builtin.encode(turn).length;
  console.log(
    `next turn, ${name}: ${n} tokens (${reused} from the cache): ${cached.toFixed(1)} ms with the cache, ${plain.toFixed(1)} ms without`,
  );
}
console.log(
  `# load average after: ${(await import("node:os"))
    .loadavg()
    .map((x) => x.toFixed(2))
    .join(" ")}`,
);
