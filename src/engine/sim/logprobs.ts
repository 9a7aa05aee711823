import type { Tokenizer } from "../../tokenizer/tokenizer.ts";
import type { OutputVocab } from "./output.ts";

/**
 * Simulated logprobs. The sim samples greedily from a made-up distribution: the chosen token
 * is always the most likely one, with a probability in [0.4, 0.99] drawn from a hash of
 * (previous token, token, position), and the alternatives share the rest, halving each rank.
 * So values are deterministic (same tokens, same logprobs), ranked, and a distribution (the
 * probabilities of a top list never sum past 1), which is all a client can check of a real
 * engine's numbers. Only requests that ask for logprobs pay for any of this.
 */
export interface TokenLogprob {
  token: string;
  /** Null for the first prompt token under `echo`: nothing precedes it. */
  logprob: number | null;
  /** Best first; the token itself is first. Empty when no alternatives were asked for. */
  top: { token: string; logprob: number }[];
}

function mix(a: number, b: number, c: number): number {
  let h =
    Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(b + 0x7f4a7c15, 0xc2b2ae35) ^ Math.imul(c, 0x27d4eb2f);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  return h >>> 0;
}

export class LogprobModel {
  private readonly vocab: OutputVocab;
  private readonly tok: Tokenizer;
  constructor(vocab: OutputVocab, tok: Tokenizer) {
    this.vocab = vocab;
    this.tok = tok;
  }

  /** The text of one prompt token (prompt tokens need not be in the output vocabulary). */
  tokenText(id: number): string {
    return this.tok.decode([id]);
  }

  /** An output token, by its index in the output vocabulary. */
  drawnEntry(prev: number, piece: number, pos: number, k: number): TokenLogprob {
    return this.entry(prev, this.vocab.ids[piece], this.vocab.pieces[piece], pos, k);
  }

  /** The first prompt token, echoed: its text, no logprob. */
  first(id: number): TokenLogprob {
    return { token: this.tokenText(id), logprob: null, top: [] };
  }

  /** Logprob of token `id` (text `text`) after token `prev` at position `pos`, with `k` ranked alternatives. */
  entry(prev: number, id: number, text: string, pos: number, k: number): TokenLogprob {
    const h = mix(prev, id, pos);
    const p0 = 0.4 + 0.59 * (h / 4294967296);
    const logprob = Math.log(p0);
    const top: TokenLogprob["top"] = [];
    if (k > 0) top.push({ token: text, logprob });
    const pieces = this.vocab.pieces;
    const seen = new Set<string>([text]);
    for (let j = 1, probe = h; top.length < k && j < 4 * k + 8; j++) {
      probe = (probe + 7919) >>> 0;
      const alt = pieces[probe % pieces.length];
      if (seen.has(alt)) continue;
      seen.add(alt);
      top.push({ token: alt, logprob: Math.log((1 - p0) * 2 ** -top.length) });
    }
    return { token: text, logprob, top };
  }
}

const bytesOf = (s: string): number[] => Array.from(Buffer.from(s, "utf8"));

/** Chat's `choice.logprobs`: `{content: [{token, logprob, bytes, top_logprobs}]}`. */
export function chatLogprobs(entries: readonly TokenLogprob[]): unknown {
  return {
    content: entries.map((e) => ({
      token: e.token,
      logprob: e.logprob ?? -9999,
      bytes: bytesOf(e.token),
      top_logprobs: e.top.map((t) => ({ token: t.token, logprob: t.logprob, bytes: bytesOf(t.token) })),
    })),
  };
}

/**
 * Completions' `choice.logprobs` (the legacy shape): parallel arrays, `text_offset` counted
 * from `offset`. The first prompt token under `echo` has null logprobs, as in vLLM.
 */
export function completionLogprobs(entries: readonly TokenLogprob[], offset: number): unknown {
  const out = {
    text_offset: [] as number[],
    token_logprobs: [] as (number | null)[],
    tokens: [] as string[],
    top_logprobs: [] as (Record<string, number> | null)[],
  };
  let at = offset;
  for (const e of entries) {
    out.text_offset.push(at);
    out.tokens.push(e.token);
    out.token_logprobs.push(e.logprob);
    if (e.logprob === null) out.top_logprobs.push(null);
    else {
      const top: Record<string, number> = {};
      for (const t of e.top) top[t.token] = t.logprob;
      out.top_logprobs.push(top);
    }
    at += e.token.length;
  }
  return out;
}
