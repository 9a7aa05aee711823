/**
 * Token ids of recently tokenized prompts, found again by their text prefix, so that a
 * conversation's next turn (which re-sends the whole history) costs only its new text.
 *
 * Why: the HF tokenizer path runs at 70–570 tokens/ms on this box (bench/tokenizer/RESULTS.md),
 * so a 40 k-token prompt takes 70–550 ms, past the 100 ms budget; the built-in o200k one does it
 * in 5–40 ms. Multi-turn traffic re-sends the previous turn's text as its head, so the ids of
 * that head can be reused instead of recomputed.
 *
 * The ids must be exactly those of tokenizing the new text (the engine's, so block hashes match).
 * Routing tokenizes piece by piece (./prompt-tokens.ts, pieces end where the pre-tokenizer splits
 * words anyway), and a piece's end is decided by reading the text up to `from + PIECE_CHARS`
 * (its "lookahead"). So a checkpoint is kept at each piece end, keyed by a hash of the text up to
 * and including that lookahead: another text with the same key has the same pieces up to there,
 * hence the same ids. The last piece of a text (cut by its end, not by a word boundary) is never
 * a checkpoint: the next turn may continue its last word.
 *
 * Keys are two chained 32-bit hashes folded to 52 bits (the approx tree's scheme); a collision
 * between different prefixes would only mis-score one request. Memory is bounded by the ids held
 * (`maxTokens`, 4 bytes each, plus one map entry per checkpoint, about one per 100 tokens),
 * least recently used first out.
 */
import { fmix32, rotl } from "../kv/hash.ts";

/** Default bound of the cache: token ids held (4 Mi ids ≈ 16 MiB + ≈ 4 MiB of checkpoints). */
export const DEFAULT_PROMPT_CACHE_TOKENS = 4 * 1024 * 1024;

const TWO20 = 1048576;

/** Special tokens the tokenizer puts around a text (its BOS), as found on the first piece. */
export interface Around {
  prefix: number[];
  suffix: number[];
}

interface Entry {
  ids: Uint32Array;
  keys: number[];
  around: Around | null;
  /** Keys still mapped to this entry; at 0 it is dropped (a longer text took all of them). */
  live: number;
}

interface Checkpoint {
  entry: Entry;
  /** Ids up to this checkpoint. */
  n: number;
}

/** A hash of a text's head, extended position by position (positions only grow). */
export class PrefixHasher {
  private readonly text: string;
  private a: number;
  private b: number;
  private at = 0;

  constructor(text: string, seed: number) {
    this.text = text;
    this.a = (0x1b873593 ^ seed) | 0;
    this.b = (0x2f0e1eba ^ Math.imul(seed, 0x85ebca6b)) | 0;
  }

  /** Key of `text[0, to)`; `to` must not be below the previous call's. */
  keyTo(to: number): number {
    const { text } = this;
    let a = this.a;
    let b = this.b;
    for (let j = this.at; j < to; j++) {
      let k = Math.imul(text.charCodeAt(j), 0xcc9e2d51);
      k = Math.imul(rotl(k, 15), 0x1b873593);
      a = (Math.imul(rotl(a ^ k, 13), 5) + 0xe6546b64) | 0;
      b = (Math.imul(rotl(b ^ k, 17), 5) + 0x7fb5d329) | 0;
    }
    this.a = a;
    this.b = b;
    this.at = to;
    return fmix32(a ^ to) * TWO20 + (fmix32(b ^ Math.imul(to, 0x9e3779b1)) >>> 12);
  }
}

export class TokenPrefixCache {
  readonly maxTokens: number;
  private readonly byKey = new Map<number, Checkpoint>();
  /** Entries, least recently used first (Set order). */
  private readonly entries = new Set<Entry>();
  private held = 0;
  /** Lookups that found a checkpoint, and ids reused through them (tests, debugging). */
  hits = 0;
  reusedTokens = 0;

  constructor(maxTokens = DEFAULT_PROMPT_CACHE_TOKENS) {
    this.maxTokens = maxTokens;
  }

  /** The cached prefix with this key, touched as recently used. */
  get(key: number): Checkpoint | undefined {
    const cp = this.byKey.get(key);
    if (cp) {
      this.entries.delete(cp.entry);
      this.entries.add(cp.entry);
    }
    return cp;
  }

  /** Counts a resumed run (`n` ids reused). */
  noteReuse(n: number): void {
    this.hits++;
    this.reusedTokens += n;
  }

  /**
   * Keeps `ids` (without the special tokens around them) of a text whose checkpoints are
   * `keys[k]`, with `counts[k]` ids up to each.
   */
  put(
    ids: readonly number[],
    keys: readonly number[],
    counts: readonly number[],
    around: Around | null,
  ): void {
    if (keys.length === 0) return;
    const last = counts[counts.length - 1]!;
    if (last === 0 || last > this.maxTokens) return;
    const entry: Entry = { ids: Uint32Array.from(ids.slice(0, last)), keys: keys.slice(), around, live: 0 };
    for (let k = 0; k < keys.length; k++) {
      const old = this.byKey.get(keys[k]!);
      if (old) this.release(old.entry);
      this.byKey.set(keys[k]!, { entry, n: counts[k]! });
      entry.live++;
    }
    this.entries.add(entry);
    this.held += entry.ids.length;
    while (this.held > this.maxTokens) {
      const oldest = this.entries.values().next().value as Entry;
      this.drop(oldest);
    }
  }

  /** Ids held (the bound is `maxTokens`). */
  size(): number {
    return this.held;
  }

  private release(e: Entry): void {
    if (--e.live === 0 && this.entries.delete(e)) this.held -= e.ids.length;
  }

  private drop(e: Entry): void {
    for (const k of e.keys) if (this.byKey.get(k)?.entry === e) this.byKey.delete(k);
    e.live = 0;
    if (this.entries.delete(e)) this.held -= e.ids.length;
  }
}
