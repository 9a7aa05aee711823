/**
 * Decoder for the engines' KV-cache event messages (engine-protocols.md §3).
 *
 * Framing: vLLM and SGLang send 3 frames `[topic, seq (8-byte BE), payload]`; ATOM sends
 * `[payload]` (empty topic) or `[topic, payload]`. The payload is a msgpack `EventBatch`
 * `[ts, events, data_parallel_rank?]` or `{ts, events, data_parallel_rank?}`; each event is a
 * positional array `[tag, ...fields]` (older vLLM, SGLang, ATOM) or a map with the tag under
 * `type` (newer vLLM). The batch decoder (./batch-decode.ts) reads these straight from the
 * bytes; the general decoder here takes whatever it leaves. Decoding never throws: bad input
 * yields a `DecodeError` value. The event types live in ./event-model.ts and are re-exported.
 */
import { Unpackr } from "msgpackr";
import { BatchDecoder } from "./batch-decode.ts";
import { decodeEvent, type EventBatch, int, type KvEvent } from "./event-model.ts";
import { unpackValue } from "./msgpack-read.ts";

export {
  type AllBlocksCleared,
  type BlockRemoved,
  type BlockStored,
  type BlockTransferred,
  decodeEvent,
  type EngineBlockHash,
  type EngineHash,
  EVENT_FIELDS,
  type EventBatch,
  type KvEvent,
  normaliseHash,
} from "./event-model.ts";

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

function unpackPayload(payload: Uint8Array): unknown {
  try {
    return unpackValue(payload);
  } catch {
    // Whatever the fast reader does not handle (or rejects) gets a second opinion from msgpackr.
    return unpackr.unpack(payload);
  }
}

const batchDecoder = new BatchDecoder();

/** Decodes an `EventBatch` payload: the batch decoder, or the general one for what it leaves. */
export function decodeBatch(payload: Uint8Array): EventBatch | DecodeError {
  return batchDecoder.decode(payload) ?? decodeBatchGeneric(payload);
}

/**
 * The general decoder: the whole payload into generic values (our reader, msgpackr for what it
 * rejects), then `decodeEvent` per event. Exported so tests can hold the batch decoder to it.
 */
export function decodeBatchGeneric(payload: Uint8Array): EventBatch | DecodeError {
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
  // Signed high word × 2^32 + unsigned low word: one rounding, as Number(BigInt) rounds (no
  // DataView or BigInt per message).
  const hi = (frame[0] << 24) | (frame[1] << 16) | (frame[2] << 8) | frame[3];
  const lo = ((frame[4] << 24) | (frame[5] << 16) | (frame[6] << 8) | frame[7]) >>> 0;
  return hi * 4294967296 + lo;
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
  // Every message of a feed carries the same topic frame: the last answer is kept.
  const last = lastTopic;
  if (last.bytes.length === frame.length && Buffer.compare(last.bytes, frame) === 0) return last.split;
  const split = splitTopicUncached(frame);
  lastTopic = { bytes: Buffer.from(frame), split };
  return split;
}

let lastTopic: { bytes: Buffer; split: { topic: string; epoch: string | null } } = {
  bytes: Buffer.alloc(0),
  split: { topic: "", epoch: null },
};

function splitTopicUncached(frame: Uint8Array): { topic: string; epoch: string | null } {
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
