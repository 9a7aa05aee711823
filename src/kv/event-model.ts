/**
 * The decoded KV events (docs/engine-protocols.md#kv-events-payload) and the general decoder of
 * one event, from a generic msgpack value: `decodeEvent` takes either encoding (a positional array `[tag,
 * ...fields]` or a map with the tag under `type`) and never throws. The builders
 * (`storedEvent`, `removedEvent`, `transferredEvent`, `cleared`) are shared with the batch
 * decoder (./batch-decode.ts), which reads the hot fields straight from the bytes, so that both
 * build the same events.
 */
import { hashString } from "./hash.ts";

/**
 * An engine block hash normalised to a number: ints as they are (uint64 above 2^53 rounded to
 * the nearest double, still unique in practice), bytes folded into 52 bits. The brand is
 * optional so a decoded number (or a test's literal) is one, while the router's own hashes
 * (./hash.ts `RouterBlockHash`, `RouterHashChain`) are refused where an engine hash is expected,
 * and an engine hash where a router hash is.
 */
export type EngineBlockHash = number & { readonly __brand?: "engine-block-hash" };
/** The former name of EngineBlockHash. */
export type EngineHash = EngineBlockHash;

export interface BlockStored {
  type: "BlockStored";
  blockHashes: EngineHash[];
  parentBlockHash: EngineHash | null;
  tokenIds: number[];
  blockSize: number;
  loraId: number | null;
  medium: string | null;
  loraName: string | null;
  extraKeys: unknown;
  groupIdx: number | null;
  /**
   * The request's cache salt when the engine sends it as a field of its own: SGLang's
   * `BlockStoredWithMetadata.metadata.cache_salt` (position 7, after medium). vLLM carries the
   * salt inside `extra_keys` instead (see saltFromExtraKeys in ./index.ts).
   */
  cacheSalt?: string | null;
  /** vLLM `kv_cache_spec_kind` (e.g. "full_attention", "sliding_window", "mamba"). */
  kvCacheSpecKind?: string | null;
  kvCacheSpecSlidingWindow?: number | null;
  /** Raw bytes of each bytes hash of an offloaded tier's store (see OffloadHashBytes). */
  hashBytes?: OffloadHashBytes;
}

/**
 * The raw bytes of each hash (null for an int hash), kept on events of another medium than GPU
 * memory only: vLLM's offloading connector names an offloaded block larger than a GPU block by
 * the concatenation of its GPU blocks' digests, which the tiers (./tiers.ts) split again; the
 * folded number of `blockHashes` cannot be split.
 */
export type OffloadHashBytes = readonly (Uint8Array | null)[];

export interface BlockRemoved {
  type: "BlockRemoved";
  blockHashes: EngineHash[];
  medium: string | null;
  groupIdx: number | null;
  /** As BlockStored's. */
  hashBytes?: OffloadHashBytes;
}

export interface AllBlocksCleared {
  type: "AllBlocksCleared";
  /** ATOM clears one medium when set (atom/distributed/kv_events.py); absent: everything. */
  medium?: string | null;
}

export interface BlockTransferred {
  type: "BlockTransferred";
  blockHashes: EngineHash[];
  fromMedium: string | null;
  toMedium: string | null;
  groupIdx: number | null;
}

export type KvEvent = BlockStored | BlockRemoved | AllBlocksCleared | BlockTransferred;

export interface EventBatch {
  ts: number;
  events: KvEvent[];
  dpRank: number | null;
  /** Events in the batch that could not be understood (unknown tag, bad fields). */
  skipped: number;
}

/** A bytes hash (vLLM's default: sha256 digests) folded into 52 bits: `b[from, to)`. */
export function foldRange(b: Uint8Array, from: number, to: number): EngineHash {
  let lo = 0x811c9dc5;
  let hi = 0x01000193;
  for (let i = from; i < to; i++) {
    lo = Math.imul(lo ^ b[i], 0x01000193);
    hi = Math.imul(hi ^ b[i] ^ (lo >>> 24), 0x5bd1e995);
  }
  return (hi >>> 12) * 4294967296 + (lo >>> 0);
}

/** Normalises one hash value; null when it is not a hash. */
export function normaliseHash(h: unknown): EngineHash | null {
  if (typeof h === "number") return Number.isFinite(h) ? h + 0 : null;
  if (typeof h === "bigint") return Number(h) + 0;
  if (h instanceof Uint8Array) return foldRange(h, 0, h.length);
  if (typeof h === "string") return hashString(h) * 1048576 + (hashString(h, 0x1234) >>> 12);
  return null;
}

function hashList(v: unknown): EngineHash[] | null {
  if (!Array.isArray(v)) {
    const one = normaliseHash(v);
    return one === null ? null : [one];
  }
  const out = new Array<EngineHash>(v.length);
  for (let i = 0; i < v.length; i++) {
    const h = normaliseHash(v[i]);
    if (h === null) return null;
    out[i] = h;
  }
  return out;
}

export function str(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v instanceof Uint8Array) return Buffer.from(v).toString("utf8");
  return null;
}

export function int(v: unknown): number | null {
  if (typeof v === "number" && Number.isInteger(v)) return v;
  if (typeof v === "bigint") return Number(v);
  return null;
}

const FIELDS: Record<string, string[]> = {
  BlockStored: [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
  ],
  BlockRemoved: ["block_hashes", "medium", "group_idx"],
  AllBlocksCleared: ["medium"],
  BlockTransferred: ["block_hashes", "from_medium", "to_medium", "group_idx"],
};

/** Field names of each tag, in positional order (docs/engine-protocols.md#kv-events-payload). */
export const EVENT_FIELDS: Readonly<Record<string, readonly string[]>> = FIELDS;

/** Whether a decoded event's medium is another than GPU memory (an offloaded tier's event). */
export function offloadMedium(medium: unknown): boolean {
  const m = str(medium);
  return m !== null && m.toUpperCase() !== "GPU";
}

/** The raw bytes of each hash of an offloaded tier's event; undefined when none is bytes. */
function offloadBytes(hashesRaw: unknown, medium: unknown): OffloadHashBytes | undefined {
  if (!offloadMedium(medium)) return undefined;
  const list = Array.isArray(hashesRaw) ? hashesRaw : [hashesRaw];
  if (!list.some((h) => h instanceof Uint8Array)) return undefined;
  return list.map((h) => (h instanceof Uint8Array ? h.slice() : null));
}

function blockStored(
  hashesRaw: unknown,
  parentRaw: unknown,
  tokenIds: unknown,
  bsRaw: unknown,
  loraId: unknown,
  medium: unknown,
  loraName: unknown,
  extraKeys: unknown,
  groupIdx: unknown,
  specKind: unknown = null,
  slidingWindow: unknown = null,
): BlockStored | null {
  const blockHashes = hashList(hashesRaw);
  if (!blockHashes || !Array.isArray(tokenIds)) return null;
  for (let i = 0; i < tokenIds.length; i++) if (typeof tokenIds[i] !== "number") return null;
  let parent: EngineHash | null = null;
  if (parentRaw != null) {
    parent = normaliseHash(parentRaw);
    if (parent === null) return null;
  }
  const ev = storedEvent(
    blockHashes,
    parent,
    tokenIds as number[],
    bsRaw,
    loraId,
    medium,
    loraName,
    extraKeys,
    groupIdx,
    specKind,
    slidingWindow,
  );
  const bytes = ev && ev.tokenIds.length === 0 ? offloadBytes(hashesRaw, medium) : undefined;
  if (ev && bytes) ev.hashBytes = bytes;
  return ev;
}

/**
 * The rest of a BlockStored once its hashes, parent and token ids are known good (normalised):
 * the side fields as decoded values, read as the general decoder reads them. Shared by the
 * general decoder and the batch decoder (./batch-decode.ts), so both build the same events.
 */
export function storedEvent(
  blockHashes: EngineHash[],
  parent: EngineHash | null,
  tokenIds: number[],
  bsRaw: unknown,
  loraId: unknown,
  medium: unknown,
  loraName: unknown,
  extraKeys: unknown,
  groupIdx: unknown,
  specKind: unknown,
  slidingWindow: unknown,
): BlockStored | null {
  const bs = int(bsRaw);
  const blockSize =
    bs !== null && bs > 0 ? bs : blockHashes.length > 0 ? tokenIds.length / blockHashes.length : 0;
  // An offloaded tier's hash-only store may leave its size out (0: unknown, ./tiers.ts).
  const sizeless = blockSize === 0 && tokenIds.length === 0 && offloadMedium(medium);
  if (!Number.isInteger(blockSize) || (blockSize <= 0 && !sizeless)) return null;
  // Position 7 is vLLM's `lora_name` (a string) but SGLang's `metadata` (a map
  // `{cache_salt}`, BlockStoredWithMetadata): tell them apart by type.
  let name: string | null = null;
  let salt: string | null = null;
  if (isMap(loraName)) {
    const s = (loraName as Record<string, unknown>).cache_salt;
    salt = typeof s === "string" && s !== "" ? s : null;
  } else name = str(loraName);
  return {
    type: "BlockStored",
    blockHashes,
    parentBlockHash: parent,
    tokenIds,
    blockSize,
    loraId: int(loraId),
    medium: str(medium),
    loraName: name,
    extraKeys: extraKeys ?? null,
    groupIdx: int(groupIdx),
    cacheSalt: salt,
    kvCacheSpecKind: str(specKind),
    kvCacheSpecSlidingWindow: int(slidingWindow),
  };
}

export function cleared(medium: unknown): AllBlocksCleared {
  const m = str(medium);
  return m === null ? { type: "AllBlocksCleared" } : { type: "AllBlocksCleared", medium: m };
}

export function isMap(v: unknown): boolean {
  return v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array);
}

function blockRemoved(hashesRaw: unknown, medium: unknown, groupIdx: unknown): BlockRemoved | null {
  const blockHashes = hashList(hashesRaw);
  if (!blockHashes) return null;
  const ev = removedEvent(blockHashes, medium, groupIdx);
  const bytes = offloadBytes(hashesRaw, medium);
  if (bytes) ev.hashBytes = bytes;
  return ev;
}

/** A BlockRemoved from normalised hashes and decoded side fields (see storedEvent). */
export function removedEvent(blockHashes: EngineHash[], medium: unknown, groupIdx: unknown): BlockRemoved {
  return { type: "BlockRemoved", blockHashes, medium: str(medium), groupIdx: int(groupIdx) };
}

function blockTransferred(
  hashesRaw: unknown,
  from: unknown,
  to: unknown,
  groupIdx: unknown,
): BlockTransferred | null {
  const blockHashes = hashList(hashesRaw);
  return blockHashes && transferredEvent(blockHashes, from, to, groupIdx);
}

/** A BlockTransferred from normalised hashes and decoded side fields (see storedEvent). */
export function transferredEvent(
  blockHashes: EngineHash[],
  from: unknown,
  to: unknown,
  groupIdx: unknown,
): BlockTransferred {
  return {
    type: "BlockTransferred",
    blockHashes,
    fromMedium: str(from),
    toMedium: str(to),
    groupIdx: int(groupIdx),
  };
}

/** Decodes one event (either encoding); null when it is not a known, well-formed event. */
export function decodeEvent(raw: unknown): KvEvent | null {
  if (Array.isArray(raw)) {
    // Positional: read fields by index, no intermediate object (the hot path).
    switch (str(raw[0])) {
      case "BlockStored":
        return blockStored(
          raw[1],
          raw[2],
          raw[3],
          raw[4],
          raw[5],
          raw[6],
          raw[7],
          raw[8],
          raw[9],
          raw[10],
          raw[11],
        );
      case "BlockRemoved":
        return blockRemoved(raw[1], raw[2], raw[3]);
      case "AllBlocksCleared":
        return cleared(raw[1]);
      case "BlockTransferred":
        return blockTransferred(raw[1], raw[2], raw[3], raw[4]);
      default:
        return null;
    }
  }
  if (raw === null || typeof raw !== "object" || raw instanceof Uint8Array) return null;
  const f = raw as Record<string, unknown>;
  switch (str(f.type ?? f.tag)) {
    case "BlockStored":
      return blockStored(
        f.block_hashes,
        f.parent_block_hash,
        f.token_ids,
        f.block_size,
        f.lora_id,
        f.medium,
        // A map-encoded SGLang event would name its metadata `metadata`.
        f.lora_name ?? f.metadata,
        f.extra_keys,
        f.group_idx,
        f.kv_cache_spec_kind,
        f.kv_cache_spec_sliding_window,
      );
    case "BlockRemoved":
      return blockRemoved(f.block_hashes, f.medium, f.group_idx);
    case "AllBlocksCleared":
      return cleared(f.medium);
    case "BlockTransferred":
      return blockTransferred(f.block_hashes, f.from_medium, f.to_medium, f.group_idx);
    default:
      return null;
  }
}
