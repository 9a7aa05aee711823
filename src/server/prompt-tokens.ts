/**
 * Bounded prompt tokenizing for routing. A BPE tokenizer's cost grows with the square of a
 * pre-tokenizer "word" (200 k identical characters took 26 s; 100 k random CJK characters 52 s),
 * and it ran on the event loop, so one adversarial prompt froze the whole server. Routing scores
 * the whole prompt when it can (issue #28 item 4: a 64 Ki-character cap made every conversation
 * past ~12.6 k tokens score the same), so the bound is time, not length:
 *
 * - the text looked at is capped only as a memory bound (`ROUTING_TEXT_CAP` characters,
 *   `ROUTING_TOKEN_CAP` ids: far past any model's context, and the body limit is 4 MiB);
 * - it is tokenized in pieces of at most `PIECE_CHARS` characters, cut where the pre-tokenizer
 *   splits words anyway (before a non-word character that follows a word character), so a
 *   pathological "word" is chunked and each piece costs a bounded amount;
 * - pieces run in slices of `SLICE_MS` on the event loop, yielding (setImmediate) in between,
 *   so other requests and /health are served while a big prompt is tokenized;
 * - past `BUDGET_MS` of tokenizing, the ids so far are what routing sees (approximate routing
 *   on a shorter prefix instead of an unbounded wait).
 *
 * Short prompts (at most one piece) keep the exact, synchronous path.
 */
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { type Around, PrefixHasher, type TokenPrefixCache } from "./token-prefix-cache.ts";

/**
 * Characters of templated prompt text that routing looks at: a memory bound (≈ 200–260 k tokens
 * of English, past any `max_model_len` served today); the time budget (`BUDGET_MS`) is what
 * bounds tokenizing. Was 64 Ki, which cut prompts past ~12.6 k tokens of the bench's words.
 */
export const ROUTING_TEXT_CAP = 1024 * 1024;
/** Token ids that routing looks at (a token-id prompt is cut here; hashing 256 Ki ids ≈ 1 ms). */
export const ROUTING_TOKEN_CAP = 256 * 1024;
/** Largest piece handed to the tokenizer at once. */
export const PIECE_CHARS = 512;
/**
 * Where a "word" with no boundary in a whole piece is cut. BPE cost grows with the square of a
 * word, so a 512-character random-CJK piece took 1–2 ms, longer than a slice; cut at 128 it
 * takes ~0.3 ms (and less in total). Only words of 384+ characters without a break are cut.
 */
export const WORD_CUT_CHARS = 128;
/**
 * Event-loop time one slice may take before yielding. A request waiting behind the slices
 * (one per loop phase it goes through) pays up to this each time: 2 ms added ~10 ms at p99.
 */
export const SLICE_MS = 1;
/**
 * Default tokenizing time per request before routing settles for the ids so far (config
 * `promptBudgetMs`). A 40 k-token prompt takes 5–40 ms here (bench/tokenizer/RESULTS.md).
 */
export const BUDGET_MS = 100;

/** Word characters: letters, marks, digits; the apostrophe joins contractions ("don't"). */
const WORD = /[\p{L}\p{M}\p{N}'’]/u;

/** ASCII word characters (letters, digits, the apostrophe), looked up without the regex. */
const ASCII_WORD = new Uint8Array(128);
for (let c = 0; c < 128; c++) ASCII_WORD[c] = WORD.test(String.fromCharCode(c)) ? 1 : 0;

/**
 * Whether the character at `i` is a word character. Called for hundreds of positions per piece
 * (the boundary search), so ASCII and the CJK ideographs (all letters) skip the regex.
 */
const isWord = (text: string, i: number): boolean => {
  const c = text.charCodeAt(i);
  if (c < 128) return ASCII_WORD[c] === 1;
  if (c >= 0x4e00 && c <= 0x9fff) return true;
  return WORD.test(text[i]!);
};

/**
 * Where the piece starting at `from` ends: the last position before `from + PIECE_CHARS` where
 * a word ends (the pre-tokenizer starts a new piece there too), else `WORD_CUT_CHARS` on (a
 * pathological word is cut; routing then differs from the engine's ids only past that cut).
 */
export function pieceEnd(text: string, from: number): number {
  const hard = from + PIECE_CHARS;
  if (hard >= text.length) return text.length;
  const low = from + (PIECE_CHARS >> 2);
  for (let p = hard; p > low; p--) {
    if (!isWord(text, p) && isWord(text, p - 1)) return p;
  }
  // No word boundary: cut the word short, and not inside a surrogate pair.
  const cut = from + WORD_CUT_CHARS;
  const c = text.charCodeAt(cut - 1);
  return c >= 0xd800 && c <= 0xdbff ? cut - 1 : cut;
}

/** The head of `text` routing looks at, ending at a word boundary near the cap. */
export function capText(text: string): string {
  if (text.length <= ROUTING_TEXT_CAP) return text;
  let end = ROUTING_TEXT_CAP;
  for (let p = ROUTING_TEXT_CAP, low = ROUTING_TEXT_CAP - PIECE_CHARS; p > low; p--) {
    if (!isWord(text, p) && isWord(text, p - 1)) {
      end = p;
      break;
    }
  }
  const c = text.charCodeAt(end - 1);
  return text.slice(0, c >= 0xd800 && c <= 0xdbff ? end - 1 : end);
}

/**
 * The special tokens `encode(…, true)` puts around a text (e.g. a BOS before it), found by
 * comparing both encodings of the first piece.
 */
function specialAround(tok: Tokenizer, piece: string, plain: readonly number[]): Around {
  const withSp = tok.encode(piece, true);
  if (withSp.length === plain.length) return { prefix: [], suffix: [] };
  for (let k = 0; k + plain.length <= withSp.length; k++) {
    let same = true;
    for (let j = 0; j < plain.length && same; j++) same = withSp[k + j] === plain[j];
    if (same) return { prefix: withSp.slice(0, k), suffix: withSp.slice(k + plain.length) };
  }
  return { prefix: [], suffix: [] };
}

export interface BoundedTokens {
  ids: number[];
  /** False when the time budget (or the id cap) ran out before the (capped) text was done. */
  complete: boolean;
}

const yieldToLoop = (): Promise<void> => new Promise((r) => setImmediate(r));

/**
 * Token ids of `text` (already capped), piece by piece, yielding to the event loop every
 * `SLICE_MS`. `addSpecialTokens` wraps the whole in what the tokenizer adds (a BOS). With a
 * `cache`, the head of a text tokenized before (a conversation's earlier turn) is reused.
 */
export async function tokenizeBounded(
  tok: Tokenizer,
  text: string,
  addSpecialTokens: boolean,
  budgetMs = BUDGET_MS,
  cache: TokenPrefixCache | null = null,
): Promise<BoundedTokens> {
  const run = new PieceRun(tok, text, addSpecialTokens, budgetMs, cache);
  while (!run.step(SLICE_MS)) await yieldToLoop();
  return run.result();
}

/** The same ids without yielding (callers that did not prepare ahead); still budgeted. */
export function tokenizeBoundedSync(
  tok: Tokenizer,
  text: string,
  addSpecialTokens: boolean,
  budgetMs = BUDGET_MS,
  cache: TokenPrefixCache | null = null,
): BoundedTokens {
  const run = new PieceRun(tok, text, addSpecialTokens, budgetMs, cache);
  run.step(Number.POSITIVE_INFINITY);
  return run.result();
}

/** One text being tokenized piece by piece. */
class PieceRun {
  private readonly tok: Tokenizer;
  private readonly text: string;
  private readonly addSpecialTokens: boolean;
  private readonly budgetMs: number;
  private readonly cache: TokenPrefixCache | null;
  private readonly hasher: PrefixHasher | null;
  private ids: number[] = [];
  private around: Around | null = null;
  /** Checkpoints passed (./token-prefix-cache.ts): their keys and the ids up to each. */
  private readonly keys: number[] = [];
  private readonly counts: number[] = [];
  private at = 0;
  private spent = 0;
  private complete = true;

  constructor(
    tok: Tokenizer,
    text: string,
    addSpecialTokens: boolean,
    budgetMs: number,
    cache: TokenPrefixCache | null,
  ) {
    this.tok = tok;
    this.text = text;
    this.addSpecialTokens = addSpecialTokens;
    this.budgetMs = budgetMs;
    this.cache = cache;
    this.hasher = cache ? new PrefixHasher(text, addSpecialTokens ? 1 : 0) : null;
  }

  /**
   * The key of the piece ending at `end` after starting at `from`, when it is a checkpoint: its
   * end was found by a word boundary (it read the text up to `from + PIECE_CHARS`), not by the
   * text's end.
   */
  private checkpointKey(from: number): number | null {
    const hard = from + PIECE_CHARS;
    return this.hasher && hard < this.text.length ? this.hasher.keyTo(hard + 1) : null;
  }

  /** Skips the head a cached text shares with this one (its pieces, their ids). */
  private resume(): void {
    const cache = this.cache!;
    let best: ReturnType<TokenPrefixCache["get"]>;
    let at = 0;
    while (at < this.text.length) {
      const key = this.checkpointKey(at);
      const hit = key === null ? undefined : cache.get(key);
      if (key === null || !hit) break;
      best = hit;
      at = pieceEnd(this.text, at);
      this.keys.push(key);
      this.counts.push(hit.n);
    }
    if (!best) return;
    // The hasher has read past the last checkpoint's lookahead; the next key continues from it.
    this.ids = Array.from(best.entry.ids.subarray(0, best.n));
    this.around = best.entry.around;
    this.at = at;
    cache.noteReuse(best.n);
  }

  /** Tokenizes pieces for up to `sliceMs`; true when finished (done, capped or out of budget). */
  step(sliceMs: number): boolean {
    const { tok, text } = this;
    const t0 = performance.now();
    if (this.at === 0 && this.cache) this.resume();
    const ids = this.ids;
    while (this.at < text.length) {
      const from = this.at;
      const end = pieceEnd(text, from);
      const piece = text.slice(from, end);
      const got = tok.encode(piece, false);
      if (from === 0 && this.addSpecialTokens) this.around = specialAround(tok, piece, got);
      for (const id of got) ids.push(id);
      this.at = end;
      const key = this.checkpointKey(from);
      if (key !== null) {
        this.keys.push(key);
        this.counts.push(ids.length);
      }
      if (ids.length > ROUTING_TOKEN_CAP || (ids.length === ROUTING_TOKEN_CAP && end < text.length)) {
        this.complete = false;
        return true;
      }
      const used = performance.now() - t0;
      if (this.spent + used > this.budgetMs) {
        this.complete = this.at >= text.length;
        return true;
      }
      if (used > sliceMs && this.at < text.length) {
        this.spent += used;
        return false;
      }
    }
    return true;
  }

  result(): BoundedTokens {
    const { ids, around, complete } = this;
    // Kept even when the budget ran out: the next turn continues from where this one stopped.
    this.cache?.put(ids, this.keys, this.counts, around);
    if (ids.length > ROUTING_TOKEN_CAP) ids.length = ROUTING_TOKEN_CAP;
    if (!around) return { ids, complete };
    return { ids: [...around.prefix, ...ids, ...(complete ? around.suffix : [])], complete };
  }
}
