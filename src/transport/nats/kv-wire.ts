/**
 * Wire format of the NATS KV-event plane.
 *
 * Live, on `infera.kv.<model>.<worker>`: payload = [seq (8-byte BE, the engine's own sequence
 * number, as its ZMQ frame carried it)][the engine's EventBatch bytes, unchanged]. For ATOM
 * (no sequence frame) the agent numbers batches from 0.
 *
 * Replay, a request on `<kv subject>.replay`: payload = [start seq (8-byte BE)][max batches (u32 BE)].
 * The agent answers on the reply inbox with the buffered live messages (same bytes) with
 * seq >= start, at most max, in order, then an end marker: [-1 (8-byte BE signed)][oldest
 * buffered seq][next seq the agent will publish] (both 8-byte BE; -1 when unknown). A start
 * below "oldest" means the history in between is gone: the subscriber resets that worker.
 */
import { randomBytes } from "node:crypto";

export const SEQ_BYTES = 8;

/**
 * NATS header naming the relay instance (epoch) that published a live or replayed batch. The
 * worker's record announces the same value (`natsKvEpoch`); a server drops batches stamped with
 * any other, and takes a sequence restart as genuine only with a new record and a new epoch.
 */
export const KV_EPOCH_HEADER = "Infera-Kv-Epoch";

/** A fresh relay epoch: 16 random hex digits. */
export function newKvEpoch(): string {
  return randomBytes(8).toString("hex");
}

/**
 * The subject a data-parallel rank's events go to when the worker lists its ranks
 * (`kvEvents.ranks`): rank 0 on the worker's subject, rank r on `<subject>.dp<r>`; each rank
 * keeps its own sequence numbers and replay (`<rank subject>.replay`).
 */
export function kvRankSubject(subject: string, dpRank: number): string {
  return dpRank === 0 ? subject : `${subject}.dp${dpRank}`;
}
export const NONE = -1;

export function encodeKvMessage(seqFrame: Uint8Array, payload: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(SEQ_BYTES + payload.length);
  out.set(seqFrame.subarray(0, SEQ_BYTES), 0);
  out.set(payload, SEQ_BYTES);
  return out;
}

export function seqFrame(seq: number): Buffer {
  const b = Buffer.alloc(SEQ_BYTES);
  b.writeBigInt64BE(BigInt(seq));
  return b;
}

/** The sequence number of a live/replayed message, or undefined when malformed; -1 = end marker. */
export function readKvSeq(msg: Uint8Array): number | undefined {
  if (msg.length < SEQ_BYTES) return undefined;
  return Number(new DataView(msg.buffer, msg.byteOffset, SEQ_BYTES).getBigInt64(0));
}

export function kvPayload(msg: Uint8Array): Uint8Array {
  return msg.subarray(SEQ_BYTES);
}

export function encodeReplayRequest(start: number, max: number): Buffer {
  const b = Buffer.alloc(SEQ_BYTES + 4);
  b.writeBigInt64BE(BigInt(start));
  b.writeUInt32BE(max >>> 0, SEQ_BYTES);
  return b;
}

export function decodeReplayRequest(b: Uint8Array): { start: number; max: number } | undefined {
  if (b.length < SEQ_BYTES) return undefined;
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const start = Number(dv.getBigInt64(0));
  const max = b.length >= SEQ_BYTES + 4 ? dv.getUint32(SEQ_BYTES) : 0;
  return { start: Math.max(0, start), max };
}

export interface ReplayEnd {
  oldest: number;
  next: number;
}

export function encodeReplayEnd(oldest: number, next: number): Buffer {
  const b = Buffer.alloc(SEQ_BYTES * 3);
  b.writeBigInt64BE(-1n, 0);
  b.writeBigInt64BE(BigInt(oldest), SEQ_BYTES);
  b.writeBigInt64BE(BigInt(next), SEQ_BYTES * 2);
  return b;
}

export function decodeReplayEnd(b: Uint8Array): ReplayEnd | undefined {
  if (b.length < SEQ_BYTES * 3) return undefined;
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  if (dv.getBigInt64(0) !== -1n) return undefined;
  return { oldest: Number(dv.getBigInt64(SEQ_BYTES)), next: Number(dv.getBigInt64(SEQ_BYTES * 2)) };
}
