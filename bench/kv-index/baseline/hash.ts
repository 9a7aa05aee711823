// Frozen copy of src/kv/hash.ts before the 64-bit router hashes (bench/kv-index baseline); do not edit.
/**
 * The router's own block hashing. Engines hash blocks differently (vLLM sha256 with a random
 * seed, SGLang sha256 over uint32 tokens, ATOM xxh64), so the index never uses an engine's hash
 * to match prompts: it re-hashes the `token_ids` each `BlockStored` event carries with this
 * function and hashes a request's prompt the same way.
 *
 * A block's hash chains its parent's: block k = H(hash(block k-1), tokens of block k). The
 * first block's parent is a seed derived from the request's `cache_salt` (vLLM puts the salt in
 * the first block's extra keys), so requests with different salts never share a prefix.
 *
 * The hash is 32 bits (murmur3-style mixing): the per-worker tables store it in a Uint32Array,
 * which is what keeps 1,000 workers × 100k blocks under 2 GiB. A collision can only make a
 * worker look one block "luckier" than it is (probability ≈ blocks held / 2^32 per lookup),
 * which is harmless for a routing hint.
 */

/** Seed of a first block without a salt. */
export const ROOT_SEED = 0x9747b28c;

function rotl(x: number, r: number): number {
  return (x << r) | (x >>> (32 - r));
}

function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Hashes `tokens[from, to)` chained onto `parent` (a previous block hash or a seed). */
export function hashBlock(parent: number, tokens: ArrayLike<number>, from: number, to: number): number {
  let h = parent | 0;
  for (let i = from; i < to; i++) {
    let k = Math.imul(tokens[i] | 0, 0xcc9e2d51);
    k = rotl(k, 15);
    k = Math.imul(k, 0x1b873593);
    h ^= k;
    h = rotl(h, 13);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  h ^= to - from;
  return fmix32(h);
}

/** 32-bit hash of a string (UTF-16 code units), for salts and text chunks. */
export function hashString(s: string, seed = 0): number {
  let h = seed | 0;
  for (let i = 0; i < s.length; i++) {
    let k = Math.imul(s.charCodeAt(i), 0xcc9e2d51);
    k = rotl(k, 15);
    k = Math.imul(k, 0x1b873593);
    h ^= k;
    h = rotl(h, 13);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  h ^= s.length;
  return fmix32(h);
}

/**
 * The parent "hash" of a sequence's first block: the fixed root seed, or one derived from the
 * LoRA adapter name and the salt. vLLM puts the LoRA name first in every block's extra keys and
 * the salt in the first block's (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys);
 * since the router chains each block onto its parent, seeding the first block with both is
 * enough to keep adapters and salts apart.
 */
export function rootSeed(cacheSalt?: string | null, loraName?: string | null): number {
  let seed = ROOT_SEED;
  if (loraName != null && loraName !== "") seed = hashString(loraName, ROOT_SEED ^ 0x10a4);
  if (cacheSalt == null || cacheSalt === "") return seed;
  return hashString(cacheSalt, seed ^ 0x5a17);
}

/**
 * Hashes of every full block of `tokens` (a trailing partial block is not cached by engines
 * and is left out). Writes into `out` when it is large enough, to avoid allocation on the hot path.
 */
export function hashPrompt(
  tokens: ArrayLike<number>,
  blockSize: number,
  cacheSalt?: string | null,
  out?: Uint32Array,
  loraName?: string | null,
): Uint32Array {
  const n = Math.floor(tokens.length / blockSize);
  const res = out && out.length >= n ? out.subarray(0, n) : new Uint32Array(n);
  let parent = rootSeed(cacheSalt, loraName);
  for (let b = 0; b < n; b++) {
    parent = hashBlock(parent, tokens, b * blockSize, (b + 1) * blockSize);
    res[b] = parent;
  }
  return res;
}
