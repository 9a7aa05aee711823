/**
 * Decoder for the engines' KV-cache event messages (engine-protocols.md §3).
 *
 * Framing: vLLM and SGLang send 3 frames `[topic, seq (8-byte BE), payload]`; ATOM sends
 * `[payload]` (empty topic) or `[topic, payload]`. The payload is a msgpack `EventBatch`
 * `[ts, events, data_parallel_rank?]`; each event is a positional array `[tag, ...fields]`
 * (older vLLM, SGLang, ATOM) or a map with the tag under `type` (newer vLLM). Both are
 * accepted at both levels. Decoding never throws: bad input yields a `DecodeError` value.
 */
import { Unpackr } from "msgpackr";
import { type FastDecoders, fastDecodeBatch } from "./fast-batch.ts";
import { hashString } from "./hash.ts";
import { unpackValue } from "./msgpack-read.ts";

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
}

export interface BlockRemoved {
  type: "BlockRemoved";
  blockHashes: EngineHash[];
  medium: string | null;
  groupIdx: number | null;
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

export interface KvMessage {
  /** The topic frame up to its first NUL (SGLang snapshot mode appends `\0sgl-kv-epoch=…`). */
  topic: string;
  /** SGLang's publisher-lifecycle epoch from the topic frame; null when absent. */
  epoch: string | null;
  /** Sequence number (vLLM/SGLang framing); null for ATOM framing. */
  seq: number | null;
  batch: EventBatch;
}

export interface DecodeError {
  error: string;
}

export type Framing = "seq" | "atom";

// int64AsType "number": block hashes arrive as uint64; a double keeps 53 significant bits,
// plenty to tell one worker's blocks apart, and avoids a BigInt per hash on the hot path.
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "number" });

export function isDecodeError<T extends object>(x: T | DecodeError): x is DecodeError {
  return (x as DecodeError).error !== undefined;
}

function foldBytes(b: Uint8Array): number {
  let lo = 0x811c9dc5;
  let hi = 0x01000193;
  for (let i = 0; i < b.length; i++) {
    lo = Math.imul(lo ^ b[i], 0x01000193);
    hi = Math.imul(hi ^ b[i] ^ (lo >>> 24), 0x5bd1e995);
  }
  return (hi >>> 12) * 4294967296 + (lo >>> 0);
}

/** Normalises one hash value; null when it is not a hash. */
export function normaliseHash(h: unknown): EngineHash | null {
  if (typeof h === "number") return Number.isFinite(h) ? h + 0 : null;
  if (typeof h === "bigint") return Number(h) + 0;
  if (h instanceof Uint8Array) return foldBytes(h);
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

function str(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v instanceof Uint8Array) return Buffer.from(v).toString("utf8");
  return null;
}

function int(v: unknown): number | null {
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

/** Field names of each tag, in positional order (engine-protocols.md §3). */
export const EVENT_FIELDS: Readonly<Record<string, readonly string[]>> = FIELDS;

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
  const bs = int(bsRaw);
  const blockSize =
    bs !== null && bs > 0 ? bs : blockHashes.length > 0 ? tokenIds.length / blockHashes.length : 0;
  if (!Number.isInteger(blockSize) || blockSize <= 0) return null;
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
    tokenIds: tokenIds as number[],
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

function cleared(medium: unknown): AllBlocksCleared {
  const m = str(medium);
  return m === null ? { type: "AllBlocksCleared" } : { type: "AllBlocksCleared", medium: m };
}

function isMap(v: unknown): boolean {
  return v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array);
}

function blockRemoved(hashesRaw: unknown, medium: unknown, groupIdx: unknown): BlockRemoved | null {
  const blockHashes = hashList(hashesRaw);
  if (!blockHashes) return null;
  return { type: "BlockRemoved", blockHashes, medium: str(medium), groupIdx: int(groupIdx) };
}

function blockTransferred(
  hashesRaw: unknown,
  from: unknown,
  to: unknown,
  groupIdx: unknown,
): BlockTransferred | null {
  const blockHashes = hashList(hashesRaw);
  if (!blockHashes) return null;
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

function unpackPayload(payload: Uint8Array): unknown {
  try {
    return unpackValue(payload);
  } catch {
    // Whatever the fast reader does not handle (or rejects) gets a second opinion from msgpackr.
    return unpackr.unpack(payload);
  }
}

const fast: FastDecoders<KvEvent> = { decodeEvent, blockStored, int };

/** Decodes an `EventBatch` payload. */
export function decodeBatch(payload: Uint8Array): EventBatch | DecodeError {
  try {
    const b = fastDecodeBatch(payload, fast);
    if (b) return b;
  } catch {
    // fall through to the general decoder, which says what is wrong
  }
  let raw: unknown;
  try {
    raw = unpackPayload(payload);
  } catch (err) {
    return { error: `msgpack: ${(err as Error).message}` };
  }
  let ts: unknown;
  let events: unknown;
  let dp: unknown;
  if (Array.isArray(raw)) [ts, events, dp] = raw;
  else if (raw !== null && typeof raw === "object") {
    const o = raw as Record<string, unknown>;
    ts = o.ts;
    events = o.events;
    dp = o.data_parallel_rank ?? o.dp_rank;
  } else return { error: "batch is neither an array nor a map" };
  if (!Array.isArray(events)) return { error: "batch has no events list" };
  const out: KvEvent[] = [];
  let skipped = 0;
  for (const e of events) {
    const ev = decodeEvent(e);
    if (ev) out.push(ev);
    else skipped++;
  }
  return { ts: typeof ts === "number" ? ts : 0, events: out, dpRank: int(dp), skipped };
}

/** Reads an 8-byte big-endian signed sequence number; null when the frame is not 8 bytes. */
export function readSeq(frame: Uint8Array): number | null {
  if (frame.length !== 8) return null;
  const dv = new DataView(frame.buffer, frame.byteOffset, 8);
  return Number(dv.getBigInt64(0, false));
}

export function encodeSeq(seq: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(BigInt(seq));
  return b;
}

/** Decodes one multipart ZMQ message. With "atom" framing a 3-frame message is still accepted. */
export function decodeMessage(frames: readonly Uint8Array[], framing: Framing): KvMessage | DecodeError {
  let topicFrame: Uint8Array | null = null;
  let seq: number | null = null;
  let payload: Uint8Array;
  if (frames.length === 3) {
    topicFrame = frames[0];
    seq = readSeq(frames[1]);
    if (seq === null) return { error: "sequence frame is not 8 bytes" };
    payload = frames[2];
  } else if (framing === "atom" && frames.length === 2) {
    topicFrame = frames[0];
    payload = frames[1];
  } else if (framing === "atom" && frames.length === 1) {
    payload = frames[0];
  } else {
    return { error: `unexpected ${frames.length}-frame message for ${framing} framing` };
  }
  const batch = decodeBatch(payload);
  if ("error" in batch) return batch;
  const { topic, epoch } = topicFrame ? splitTopic(topicFrame) : { topic: "", epoch: null };
  return { topic, epoch, seq, batch };
}

const EPOCH_MARKER = "sgl-kv-epoch=";

/**
 * Splits a topic frame into the configured topic (up to the first NUL) and SGLang's epoch.
 * SGLang's snapshot-capable publisher sends `topic + "\0sgl-kv-epoch=" + epoch`, and a snapshot
 * barrier adds `"\0sgl-kv-snapshot=" + id` (sglang python/sglang/srt/disaggregation/kv_events.py,
 * `_live_topic` / `_snapshot_barrier_topic`).
 */
export function splitTopic(frame: Uint8Array): { topic: string; epoch: string | null } {
  const nul = frame.indexOf(0);
  if (nul < 0) return { topic: Buffer.from(frame).toString("utf8"), epoch: null };
  const topic = Buffer.from(frame.subarray(0, nul)).toString("utf8");
  let epoch: string | null = null;
  for (const part of Buffer.from(frame.subarray(nul + 1))
    .toString("utf8")
    .split("\0"))
    if (part.startsWith(EPOCH_MARKER)) epoch = part.slice(EPOCH_MARKER.length);
  return { topic, epoch };
}
