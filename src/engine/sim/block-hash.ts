import { createHash } from "node:crypto";

/**
 * The simulated engine's own block hash: sha256 over (domain tag, parent hash, extra keys,
 * token ids as uint32 LE), low 64 bits of the digest as an unsigned integer. Chained: each
 * block's hash covers its parent's, so equal hashes mean equal prefixes. The domain tag keeps
 * it distinct from any router hash (the router must key on the token ids the events carry).
 * `extraKey` (the request's cache_salt) enters the first block only, as in vLLM.
 */
const DOMAIN = Buffer.from("infera-sim-block-v1");

export function blockHash(
  parent: bigint | null,
  tokens: readonly number[],
  start: number,
  end: number,
  extraKey: string | null,
): bigint {
  const h = createHash("sha256");
  h.update(DOMAIN);
  const head = Buffer.allocUnsafe(9);
  head[0] = parent === null ? 0 : 1;
  head.writeBigUInt64LE(parent ?? 0n, 1);
  h.update(head);
  if (extraKey !== null) h.update(`salt:${extraKey}`);
  const body = Buffer.allocUnsafe((end - start) * 4);
  for (let i = start; i < end; i++) body.writeUInt32LE(tokens[i] >>> 0, (i - start) * 4);
  h.update(body);
  return h.digest().readBigUInt64BE(0);
}

/** Hashes of every full block of `tokens`, extending `known` (already computed prefix hashes) in place. */
export function extendBlockHashes(
  known: bigint[],
  tokens: readonly number[],
  blockSize: number,
  salt: string | null,
): bigint[] {
  const full = Math.floor(tokens.length / blockSize);
  for (let b = known.length; b < full; b++) {
    const parent = b === 0 ? null : known[b - 1];
    known.push(blockHash(parent, tokens, b * blockSize, (b + 1) * blockSize, b === 0 ? salt : null));
  }
  return known;
}
