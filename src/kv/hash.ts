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
 * The hash is 64 bits, computed as two 32-bit lanes (murmur3-style mixing, each lane seeded from
 * both lanes of the parent, crossed at the end as murmur3's x86_128 does), so the hot path never
 * touches a BigInt. With 32 bits a fleet of 1,000 workers × 100k blocks saw a false "cached"
 * block about once every 43 lookups across the fleet; with 64 bits a collision that fakes a hit
 * is out of reach (≈ 1e8 / 2^64 per lookup).
 *
 * Chains are Uint32Arrays of lanes, block k at [2k] (low) and [2k + 1] (high): `RouterHashChain`.
 * A single hash, where one is needed as a value (tests, debugging), is a `RouterBlockHash`
 * bigint. Both are branded so the compiler refuses an engine's block hash (./events.ts
 * `EngineBlockHash`, a number) where a router hash is expected, and the other way round.
 */

/** One router block hash as a value (not used on the hot path). */
export type RouterBlockHash = bigint & { readonly __brand: "router-block-hash" };

/** A prompt's router block hashes as lanes: block k at [2k] (low 32 bits) and [2k + 1] (high). */
export type RouterHashChain = Uint32Array & { readonly __brand: "router-hash-chain" };

/** Seed of a first block without a salt (low lane; the high lane is ROOT_SEED_HI). */
export const ROOT_SEED = 0x9747b28c;
const ROOT_SEED_HI = 0x3c6ef372;

/** 32-bit rotate left (murmur3's). */
export function rotl(x: number, r: number): number {
  return (x << r) | (x >>> (32 - r));
}

/** murmur3's 32-bit finaliser (avalanche), as an unsigned 32-bit number. */
export function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * Hashes `tokens[from, to)` chained onto the parent (`parentLo`, `parentHi`: a previous block's
 * lanes or a seed) and writes the two lanes to `out[at]` (low) and `out[at + 1]` (high).
 */
export function hashBlockInto(
  parentLo: number,
  parentHi: number,
  tokens: ArrayLike<number>,
  from: number,
  to: number,
  out: Uint32Array,
  at: number,
): void {
  // Each lane starts from both parent lanes, so a difference in either carries into both.
  let a = (parentLo ^ Math.imul(parentHi, 0x9e3779b1)) | 0;
  let b = (parentHi ^ Math.imul(rotl(parentLo, 11), 0x85ebca77)) | 0;
  for (let i = from; i < to; i++) {
    const t = tokens[i] | 0;
    let k = Math.imul(t, 0xcc9e2d51);
    k = rotl(k, 15);
    k = Math.imul(k, 0x1b873593);
    a ^= k;
    a = rotl(a, 13);
    a = (Math.imul(a, 5) + 0xe6546b64) | 0;
    // The high lane mixes more cheaply (one multiply, one rotation per token): its job is to
    // make the pair 64 bits wide; the final mixing below gives both lanes full avalanche.
    b = rotl(Math.imul(b ^ t, 0x2545f491), 13);
  }
  const n = to - from;
  a ^= n;
  b ^= n;
  a = (a + b) | 0;
  b = (b + a) | 0;
  a = fmix32(a);
  b = fmix32(b);
  a = (a + b) | 0;
  b = (b + a) | 0;
  out[at] = a;
  out[at + 1] = b;
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
 * The parent lanes of a sequence's first block, written to `out[0..1]`: the fixed root seed, or
 * one derived from the LoRA adapter name and the salt. vLLM puts the LoRA name first in every
 * block's extra keys and the salt in the first block's (vllm/v1/core/kv_cache_utils.py
 * generate_block_hash_extra_keys); since the router chains each block onto its parent, seeding
 * the first block with both is enough to keep adapters and salts apart.
 */
export function rootSeedInto(out: Uint32Array, cacheSalt?: string | null, loraName?: string | null): void {
  let lo = ROOT_SEED;
  let hi = ROOT_SEED_HI;
  if (loraName != null && loraName !== "") {
    const l = hashString(loraName, lo ^ 0x10a4);
    hi = hashString(loraName, hi ^ 0x7f4a7c15);
    lo = l;
  }
  if (cacheSalt != null && cacheSalt !== "") {
    const l = hashString(cacheSalt, lo ^ 0x5a17);
    hi = hashString(cacheSalt, hi ^ 0x165667b1);
    lo = l;
  }
  out[0] = lo;
  out[1] = hi;
}

const seedScratch = new Uint32Array(2);

/**
 * Router hashes of every full block of `tokens` (a trailing partial block is not cached by
 * engines and is left out), as lanes. Writes into `out` when it is large enough (2 lanes per
 * block), to avoid allocation on the hot path.
 */
export function hashPrompt(
  tokens: ArrayLike<number>,
  blockSize: number,
  cacheSalt?: string | null,
  out?: Uint32Array,
  loraName?: string | null,
): RouterHashChain {
  const n = Math.floor(tokens.length / blockSize);
  const res = (
    out && out.length >= 2 * n ? out.subarray(0, 2 * n) : new Uint32Array(2 * n)
  ) as RouterHashChain;
  rootSeedInto(seedScratch, cacheSalt, loraName);
  let lo = seedScratch[0];
  let hi = seedScratch[1];
  for (let b = 0; b < n; b++) {
    hashBlockInto(lo, hi, tokens, b * blockSize, (b + 1) * blockSize, res, 2 * b);
    lo = res[2 * b];
    hi = res[2 * b + 1];
  }
  return res;
}

/** Blocks in a chain. */
export function chainBlocks(chain: RouterHashChain): number {
  return chain.length >>> 1;
}

/** Block `k` of a chain as one value (for tests and debugging; allocates a BigInt). */
export function routerHashAt(chain: RouterHashChain, k: number): RouterBlockHash {
  return ((BigInt(chain[2 * k + 1]) << 32n) | BigInt(chain[2 * k])) as RouterBlockHash;
}
