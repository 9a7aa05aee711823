import type { Tokenizer } from "../../tokenizer/tokenizer.ts";
import type { Mulberry32 } from "../../util/mulberry32.ts";

/**
 * Deterministic output text. Tokens are drawn, with a per-sequence seeded PRNG, from a
 * vocabulary of ordinary English word pieces of the loaded tokenizer, so that the text reads
 * as words and its token ids re-encode to themselves in the usual case. Each piece's text is
 * precomputed once, so decoding on the hot path is a table lookup.
 */
const CORPUS =
  "The quick brown fox jumps over the lazy dog while a gentle river flows past the old stone bridge. " +
  "Engineers measure latency and throughput carefully, because every cluster behaves a little differently under load. " +
  "In the morning the market opens early; farmers bring apples, bread, cheese and fresh flowers from nearby villages. " +
  "A simple plan, written clearly and tested often, usually beats a clever one that nobody understands. " +
  "Light travels fast, sound travels slower, and news travels fastest of all across the small town square. " +
  "She opened the window, looked at the clouds, and decided that today would be a good day to walk by the sea. " +
  "Numbers such as one, two, three and four appear in many stories about time, money, distance and weather. " +
  "Good teams share knowledge, review each change, and keep their systems running smoothly through the night.";

export class OutputVocab {
  readonly ids: Int32Array;
  readonly pieces: string[];

  constructor(ids: number[], pieces: string[]) {
    this.ids = Int32Array.from(ids);
    this.pieces = pieces;
  }

  static build(tok: Tokenizer): OutputVocab {
    const seen = new Set<number>();
    const ids: number[] = [];
    const pieces: string[] = [];
    // An anchor before each token keeps tokenizers that strip a leading space (sentencepiece
    // "▁" pieces) from losing it: piece = decode([anchor, id]) minus decode([anchor]).
    const anchorIds = tok.encode("The");
    const anchor = anchorIds.length > 0 ? anchorIds[0] : null;
    const anchorText = anchor === null ? "" : tok.decode([anchor]);
    for (const id of tok.encode(CORPUS)) {
      if (seen.has(id)) continue;
      seen.add(id);
      const text = anchor === null ? tok.decode([id]) : tok.decode([anchor, id]).slice(anchorText.length);
      if (text.length === 0 || !/^[ A-Za-z,.;']+$/.test(text)) continue;
      ids.push(id);
      pieces.push(text);
    }
    if (ids.length === 0) throw new Error(`tokenizer ${tok.id} yields no usable output vocabulary`);
    return new OutputVocab(ids, pieces);
  }
}

/** FNV-1a 32-bit over a string, for seeding. */
export function hashString(s: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

export type FinishReason = "stop" | "length" | "abort";

/**
 * One sequence's generated text: token choice, stop strings (vLLM excludes the matched stop
 * string from the output), and the streaming delta that can be released without showing a
 * prefix of a stop string.
 */
export class OutputText {
  private readonly vocab: OutputVocab;
  private readonly rng: Mulberry32;
  private readonly stop: readonly string[];
  text = "";
  private emitted = 0;
  private readonly holdBack: number;
  stopped = false;
  /**
   * What ended the text early, as vLLM reports it in `stop_reason`: the matched stop string,
   * or the stop token id; null otherwise (EOS, length).
   */
  stopReason: string | number | null = null;
  /** Vocabulary index of every token drawn, kept only when the request wants logprobs. */
  readonly drawn: number[] | null;
  /** A scripted answer (structured output, tool call): its pieces are "sampled" in order. */
  private readonly script: readonly string[] | null;
  private scriptAt = 0;
  private readonly stopTokenIds: ReadonlySet<number> | null;
  private lastId = 0;

  constructor(
    vocab: OutputVocab,
    rng: Mulberry32,
    stop: readonly string[],
    recordDrawn = false,
    opts: { script?: readonly string[] | null; stopTokenIds?: readonly number[] } = {},
  ) {
    this.vocab = vocab;
    this.rng = rng;
    this.stop = stop;
    this.drawn = recordDrawn ? [] : null;
    this.script = opts.script ?? null;
    this.stopTokenIds = opts.stopTokenIds && opts.stopTokenIds.length > 0 ? new Set(opts.stopTokenIds) : null;
    let longest = 0;
    for (const s of stop) longest = Math.max(longest, s.length);
    this.holdBack = longest > 0 ? longest - 1 : 0;
  }

  /** Pieces a scripted answer has (its natural length); null when the text is free. */
  get scriptLength(): number | null {
    return this.script ? this.script.length : null;
  }

  nextToken(): number {
    const i = Math.floor(this.rng.next() * this.vocab.ids.length);
    this.lastPiece = i;
    this.drawn?.push(i);
    this.lastId = this.vocab.ids[i];
    return this.lastId;
  }

  private lastPiece = 0;

  /** Appends the last drawn token's text; returns true when a stop string or stop token matched. */
  appendLast(): boolean {
    if (this.stopTokenIds?.has(this.lastId) && !this.script) {
      // vLLM: a stop token ends the sequence, its text is not in the output, stop_reason = id.
      this.stopped = true;
      this.stopReason = this.lastId;
      return true;
    }
    const piece = this.script ? (this.script[this.scriptAt++] ?? "") : this.vocab.pieces[this.lastPiece];
    if (this.stop.length === 0) {
      // Without stop strings the delta is just the pieces: no slicing of `text` (a rope that
      // slicing would flatten on every token).
      this.text += piece;
      this.unsent += piece;
      return false;
    }
    const searchFrom = Math.max(0, this.text.length - this.holdBack);
    this.text += piece;
    let cut = -1;
    let matched = "";
    for (const s of this.stop) {
      if (s.length === 0) continue;
      const at = this.text.indexOf(s, searchFrom);
      if (at >= 0 && (cut < 0 || at < cut)) {
        cut = at;
        matched = s;
      }
    }
    if (cut >= 0) {
      this.text = this.text.slice(0, cut);
      this.stopped = true;
      this.stopReason = matched;
      return true;
    }
    return false;
  }

  private unsent = "";

  /** Text not yet sent; with `final`, everything left. */
  takeDelta(final: boolean): string {
    if (this.stop.length === 0) {
      const d = this.unsent;
      this.unsent = "";
      return d;
    }
    const end =
      final || this.stopped ? this.text.length : Math.max(this.emitted, this.text.length - this.holdBack);
    if (end <= this.emitted) return "";
    const d = this.text.slice(this.emitted, end);
    this.emitted = end;
    return d;
  }
}
