/**
 * Bounded prompt tokenizing for routing. A BPE tokenizer's cost grows with the square of a
 * pre-tokenizer "word" (200 k identical characters took 26 s; 100 k random CJK characters 52 s),
 * and it ran on the event loop, so one adversarial prompt froze the whole server. Routing only
 * needs the prompt's leading blocks, so:
 *
 * - the text looked at is capped (`ROUTING_TEXT_CAP` characters, `ROUTING_TOKEN_CAP` ids);
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
import type { Tokenizer } from "../kv/tokenizer.ts";

/** Characters of templated prompt text that routing looks at (≈ 16 k tokens of English). */
export const ROUTING_TEXT_CAP = 64 * 1024;
/** Token ids that routing looks at (a token-id prompt is cut here). */
export const ROUTING_TOKEN_CAP = 32 * 1024;
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
/** Total tokenizing time per request before routing settles for the ids so far. */
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
function specialAround(tok: Tokenizer, piece: string, plain: readonly number[]) {
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
  /** False when the time budget ran out before the (capped) text was done. */
  complete: boolean;
}

const yieldToLoop = (): Promise<void> => new Promise((r) => setImmediate(r));

/**
 * Token ids of `text` (already capped), piece by piece, yielding to the event loop every
 * `SLICE_MS`. `addSpecialTokens` wraps the whole in what the tokenizer adds (a BOS).
 */
export async function tokenizeBounded(
  tok: Tokenizer,
  text: string,
  addSpecialTokens: boolean,
  budgetMs = BUDGET_MS,
): Promise<BoundedTokens> {
  const run = new PieceRun(tok, text, addSpecialTokens, budgetMs);
  while (!run.step(SLICE_MS)) await yieldToLoop();
  return run.result();
}

/** The same ids without yielding (callers that did not prepare ahead); still budgeted. */
export function tokenizeBoundedSync(
  tok: Tokenizer,
  text: string,
  addSpecialTokens: boolean,
  budgetMs = BUDGET_MS,
): BoundedTokens {
  const run = new PieceRun(tok, text, addSpecialTokens, budgetMs);
  run.step(Number.POSITIVE_INFINITY);
  return run.result();
}

/** One text being tokenized piece by piece. */
class PieceRun {
  private readonly tok: Tokenizer;
  private readonly text: string;
  private readonly addSpecialTokens: boolean;
  private readonly budgetMs: number;
  private readonly ids: number[] = [];
  private around: { prefix: number[]; suffix: number[] } | null = null;
  private at = 0;
  private spent = 0;
  private complete = true;

  constructor(tok: Tokenizer, text: string, addSpecialTokens: boolean, budgetMs: number) {
    this.tok = tok;
    this.text = text;
    this.addSpecialTokens = addSpecialTokens;
    this.budgetMs = budgetMs;
  }

  /** Tokenizes pieces for up to `sliceMs`; true when finished (done, capped or out of budget). */
  step(sliceMs: number): boolean {
    const { tok, text, ids } = this;
    const t0 = performance.now();
    while (this.at < text.length) {
      const end = pieceEnd(text, this.at);
      const piece = text.slice(this.at, end);
      const got = tok.encode(piece, false);
      if (this.at === 0 && this.addSpecialTokens) this.around = specialAround(tok, piece, got);
      for (const id of got) ids.push(id);
      this.at = end;
      if (ids.length >= ROUTING_TOKEN_CAP) return true;
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
    if (ids.length > ROUTING_TOKEN_CAP) ids.length = ROUTING_TOKEN_CAP;
    if (!around) return { ids, complete };
    return { ids: [...around.prefix, ...ids, ...(complete ? around.suffix : [])], complete };
  }
}
