/**
 * The hot path of KV event decoding: reads a positional `EventBatch` straight from the msgpack
 * bytes into events, without first building generic arrays for each event. Anything unusual
 * (map-encoded events, other tags) goes through the general `decodeEvent`, and a payload this
 * reader rejects is handed back to the general decoder by the caller.
 *
 * Generic over the event type `E` (./events.ts instantiates it with `KvEvent`) so that this
 * module needs nothing from ./events.ts, which imports it: no import cycle between the two.
 */
import { MsgpackReader } from "./msgpack-read.ts";

/** What ./events.ts's `EventBatch` is when `E` is its `KvEvent`. */
export interface FastBatch<E> {
  ts: number;
  events: E[];
  dpRank: number | null;
  skipped: number;
}

export interface FastDecoders<E> {
  decodeEvent(raw: unknown): E | null;
  blockStored(
    hashes: unknown,
    parent: unknown,
    tokenIds: unknown,
    bs: unknown,
    loraId: unknown,
    medium: unknown,
    loraName: unknown,
    extraKeys: unknown,
    groupIdx: unknown,
    specKind: unknown,
    slidingWindow: unknown,
  ): E | null;
  int(v: unknown): number | null;
}

/** Throws (RangeError) on malformed msgpack; returns null when the batch is not an array. */
export function fastDecodeBatch<E>(payload: Uint8Array, d: FastDecoders<E>): FastBatch<E> | null {
  const r = new MsgpackReader(payload);
  const n = r.arrayHeader();
  if (n < 2) return null;
  const ts = r.read();
  const m = r.arrayHeader();
  if (m < 0) return null;
  const events: E[] = [];
  let skipped = 0;
  for (let e = 0; e < m; e++) {
    const c = r.arrayHeader();
    let ev: E | null;
    if (c < 0) ev = d.decodeEvent(r.read());
    else if (c === 0) ev = null;
    else {
      const tag = r.read();
      if (tag === "BlockStored" && c >= 4) {
        // Integer hashes (vLLM, SGLang) read straight into numbers; bytes etc. the general way.
        const hashes = r.tryNumberArray() ?? r.read();
        const parent = r.read();
        const tokens = r.numberArray();
        const bs = c > 4 ? r.read() : null;
        const loraId = c > 5 ? r.read() : null;
        const medium = c > 6 ? r.read() : null;
        const loraName = c > 7 ? r.read() : null;
        const extraKeys = c > 8 ? r.read() : null;
        const groupIdx = c > 9 ? r.read() : null;
        const specKind = c > 10 ? r.read() : null;
        const slidingWindow = c > 11 ? r.read() : null;
        for (let i = 12; i < c; i++) r.read();
        ev = tokens
          ? d.blockStored(
              hashes,
              parent,
              tokens,
              bs,
              loraId,
              medium,
              loraName,
              extraKeys,
              groupIdx,
              specKind,
              slidingWindow,
            )
          : null;
      } else {
        const raw: unknown[] = [tag];
        for (let i = 1; i < c; i++) raw.push(r.read());
        ev = d.decodeEvent(raw);
      }
    }
    if (ev) events.push(ev);
    else skipped++;
  }
  const dp = n > 2 ? r.read() : null;
  for (let i = 3; i < n; i++) r.read();
  if (!r.done) throw new RangeError("msgpack: trailing bytes after the batch");
  return { ts: typeof ts === "number" ? ts : 0, events, dpRank: d.int(dp), skipped };
}
