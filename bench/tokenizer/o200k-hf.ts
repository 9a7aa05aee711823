/**
 * Writes a Hugging Face `tokenizer.json` equivalent to the built-in o200k_base vocabulary (the
 * `gpt-tokenizer` package's ranks), so the HF tokenizer path (src/tokenizer/hf-tokenizer.ts) can be
 * measured on a real-sized vocabulary without downloading a model. The conversion is the usual
 * tiktoken → HF one: byte-level token strings (GPT-2's bytes_to_unicode), and each token's merge
 * found by running BPE on its bytes with the ranks below its own.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import ranks from "gpt-tokenizer/esm/bpeRanks/o200k_base";

/** tiktoken's o200k split pattern (gpt-tokenizer's constants.ts; openai/tiktoken tiktoken_ext/openai_public.py). */
const O200K_PATTERN = String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'(?:[sS]|[dD]|[mM]|[tT]|[lL][lL]|[vV][eE]|[rR][eE]))?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'(?:[sS]|[dD]|[mM]|[tT]|[lL][lL]|[vV][eE]|[rR][eE]))?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

/** GPT-2's byte → printable character map. */
function byteChars(): string[] {
  const out: string[] = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    out[b] = String.fromCharCode(printable ? b : 256 + n++);
  }
  return out;
}

const latin1 = (b: Uint8Array): string => Buffer.from(b).toString("latin1");

/** Writes tokenizer.json + tokenizer_config.json into `dir`; returns `dir`. */
export function writeO200kHf(dir: string): string {
  const bc = byteChars();
  const list = ranks as unknown as (string | number[])[];
  const bytes = list.map((t) =>
    typeof t === "string" ? new Uint8Array(Buffer.from(t, "utf8")) : Uint8Array.from(t),
  );
  const rankOf = new Map<string, number>();
  for (let r = 0; r < bytes.length; r++) rankOf.set(latin1(bytes[r]!), r);
  const bl = (b: Uint8Array): string => {
    let s = "";
    for (const x of b) s += bc[x];
    return s;
  };
  const vocab: Record<string, number> = {};
  const merges: [string, string][] = [];
  for (let r = 0; r < bytes.length; r++) {
    const b = bytes[r]!;
    vocab[bl(b)] = r;
    if (b.length < 2) continue;
    // BPE on the token's own bytes with only lower ranks: the last merge makes the token.
    let parts: Uint8Array[] = Array.from(b, (x) => Uint8Array.of(x));
    while (parts.length > 2) {
      let best = -1;
      let bestRank = Number.POSITIVE_INFINITY;
      for (let i = 0; i + 1 < parts.length; i++) {
        const rr = rankOf.get(latin1(parts[i]!) + latin1(parts[i + 1]!));
        if (rr !== undefined && rr < r && rr < bestRank) {
          bestRank = rr;
          best = i;
        }
      }
      if (best < 0) break;
      const m = new Uint8Array(parts[best]!.length + parts[best + 1]!.length);
      m.set(parts[best]!);
      m.set(parts[best + 1]!, parts[best]!.length);
      parts = [...parts.slice(0, best), m, ...parts.slice(best + 2)];
    }
    if (parts.length === 2) merges.push([bl(parts[0]!), bl(parts[1]!)]);
  }
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [
      {
        id: 199999,
        content: "<|endoftext|>",
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: true,
      },
    ],
    normalizer: null,
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: O200K_PATTERN }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: true,
      vocab,
      merges,
    },
  };
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(json));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ eos_token: "<|endoftext|>" }));
  return dir;
}
