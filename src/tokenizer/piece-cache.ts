/**
 * A small cache of BPE pieces in front of gpt-tokenizer's o200k encoder (issue #32).
 *
 * tiktoken-style BPE splits the text with one regex and encodes every piece on its own, most of
 * them by one lookup in a 200,000-entry `Map` (a piece in the vocabulary is one token). In a busy
 * server that table is cache-cold: perf of the 256-worker server put 6 % of its CPU in
 * `FindOrderedHashMapEntry` under `encodeNative`, about 30 µs for a 55-token prompt that takes 5
 * µs in a loop alone. Words repeat (Zipf), so a few thousand recent pieces answer most lookups
 * from a table small enough to stay in cache.
 *
 * Exact by construction: the same split regex, and for a piece not cached the encoder's own two
 * steps (`getBpeRankFromString`, else `bytePairEncode`), as its `encodeNative` runs them per
 * piece. Those are internal to gpt-tokenizer (private in its types), so `pieceEncoder` checks
 * their shape and returns null when a release changes it; the caller then encodes as before.
 * test/tokenizer/piece-cache.test.ts compares the two on varied text.
 */

/** The per-piece half of gpt-tokenizer's BytePairEncodingCore (4.x). */
interface PieceCore {
  tokenSplitRegex: RegExp;
  getBpeRankFromString(piece: string): number | undefined;
  bytePairEncode(piece: string): number[];
}

function isPieceCore(x: unknown): x is PieceCore {
  const c = x as Partial<PieceCore> | null | undefined;
  return (
    c != null &&
    c.tokenSplitRegex instanceof RegExp &&
    c.tokenSplitRegex.global &&
    typeof c.getBpeRankFromString === "function" &&
    typeof c.bytePairEncode === "function"
  );
}

/** Pieces longer than this are encoded, not cached (long runs of spaces or symbols: rare, one-off). */
const MAX_PIECE_CHARS = 24;

export class PieceCache {
  private readonly core: PieceCore;
  private readonly capacity: number;
  /** Two generations: a hit in `old` moves to `young`; a full `young` becomes `old`. */
  private young = new Map<string, number | readonly number[]>();
  private old = new Map<string, number | readonly number[]>();

  constructor(core: PieceCore, capacity = 4096) {
    this.core = core;
    this.capacity = capacity;
  }

  /** Token ids of `text`, special-token strings as plain text (gpt-tokenizer with no special tokens allowed). */
  encode(text: string): number[] {
    const out: number[] = [];
    const re = this.core.tokenSplitRegex;
    re.lastIndex = 0;
    for (let m = re.exec(text); m !== null; m = re.exec(text)) {
      const piece = m[0];
      // A zero-width match would not advance (the o200k pattern has none; kept as exec's rule).
      if (piece.length === 0) {
        re.lastIndex++;
        continue;
      }
      const ids = this.piece(piece);
      if (typeof ids === "number") out.push(ids);
      else for (let i = 0; i < ids.length; i++) out.push(ids[i]);
    }
    return out;
  }

  private piece(piece: string): number | readonly number[] {
    let ids = this.young.get(piece);
    if (ids !== undefined) return ids;
    ids = this.old.get(piece);
    if (ids === undefined) {
      ids = this.core.getBpeRankFromString(piece) ?? this.core.bytePairEncode(piece);
      if (piece.length > MAX_PIECE_CHARS) return ids;
    }
    if (this.young.size >= this.capacity) {
      this.old = this.young;
      this.young = new Map();
    }
    this.young.set(piece, ids);
    return ids;
  }
}

/** A PieceCache over `api`'s encoder (gpt-tokenizer's default export), or null when its internals differ. */
export function pieceEncoder(api: unknown): PieceCache | null {
  const core = (api as { bytePairEncodingCoreProcessor?: unknown } | null)?.bytePairEncodingCoreProcessor;
  return isPieceCore(core) ? new PieceCache(core) : null;
}
