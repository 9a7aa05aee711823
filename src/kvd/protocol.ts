/**
 * kvd wire protocol (documented in docs/kvd-protocol.md). Every frame, in both directions:
 *
 *   offset size  field
 *   0      4     magic  0x3144564b ("KVD1" little-endian)
 *   4      1     op     (Op below)
 *   5      1     flags  bit0 = response, bit1 = error
 *   6      2     reserved, 0
 *   8      4     request id (echoed in the response; clients pick them)
 *   12     4     meta length  (UTF-8 JSON object)
 *   16     4     data length  (raw bytes: chunk payloads, concatenated in item order)
 *   20     ...   meta, then data
 *
 * All integers little-endian. JSON carries the small structured part (keys, sizes, offsets)
 * so clients in any language need only a JSON parser; bulk bytes are never JSON-encoded.
 */
export const MAGIC = 0x3144564b;
export const HEADER_BYTES = 20;
export const PROTOCOL_VERSION = 1;
export const MAX_META_BYTES = 4 * 1024 * 1024;

export const Op = {
  HELLO: 1,
  PUT: 2,
  ALLOC: 3,
  COMMIT: 4,
  GET: 5,
  EXISTS: 6,
  LOOKUP: 7,
  DELETE: 8,
  PIN: 9,
  UNPIN: 10,
  RELEASE: 11,
  STATS: 12,
} as const;
export type OpCode = (typeof Op)[keyof typeof Op];
const OP_CODES = new Set<number>(Object.values(Op));

const EMPTY = Buffer.alloc(0);

export const FLAG_RESPONSE = 0x1;
export const FLAG_ERROR = 0x2;

export interface Frame {
  op: number;
  flags: number;
  id: number;
  meta: Record<string, unknown>;
  data: Buffer;
  /** Set when the data section was received into a DataSink destination. */
  sinkToken?: number;
}

/** A framing violation: the connection that sent it is closed (the daemon keeps running). */
export class ProtocolError extends Error {
  /** Frames the same push completed before the violation (answered before the connection closes). */
  framesBefore?: Frame[];
}

/**
 * A header that declares more meta or data than the receiver accepts. Raised before a byte
 * of it is buffered; the daemon answers it with a 413 error frame (op and id of the offending
 * request) before it closes the connection, so the client learns why.
 */
export class FrameTooLargeError extends ProtocolError {
  readonly op: number;
  readonly id: number;
  readonly limit: number;
  constructor(message: string, op: number, id: number, limit: number) {
    super(message);
    this.op = op;
    this.id = id;
    this.limit = limit;
  }
}

/**
 * A frame as the Buffers to write: the header and meta together in the first (one
 * allocation, and a frame without data is a single write), then the data parts as given.
 */
export function encodeFrame(
  op: number,
  flags: number,
  id: number,
  meta: object,
  data?: Buffer | Buffer[],
): Buffer[] {
  if (data === undefined) return [encodeHead(op, flags, id, meta, 0)];
  if (!Array.isArray(data)) return [encodeHead(op, flags, id, meta, data.length), data];
  let dataLen = 0;
  for (const p of data) dataLen += p.length;
  return [encodeHead(op, flags, id, meta, dataLen), ...data];
}

/** Header and meta of a frame whose data section (sent separately) is `dataLen` bytes. */
export function encodeHead(op: number, flags: number, id: number, meta: object, dataLen: number): Buffer {
  const json = JSON.stringify(meta);
  const metaLen = Buffer.byteLength(json, "utf8");
  const h = Buffer.allocUnsafe(HEADER_BYTES + metaLen);
  h.writeUInt32LE(MAGIC, 0);
  h[4] = op;
  h[5] = flags;
  h.writeUInt16LE(0, 6);
  h.writeUInt32LE(id >>> 0, 8);
  h.writeUInt32LE(metaLen, 12);
  h.writeUInt32LE(dataLen, 16);
  h.write(json, HEADER_BYTES, metaLen, "utf8");
  return h;
}

/** Total frame length if `buf` starts with a complete header, else -1. Throws on bad magic. */
export function frameLength(buf: Buffer): number {
  if (buf.length < HEADER_BYTES) return -1;
  if (buf.readUInt32LE(0) !== MAGIC) throw new ProtocolError("bad magic");
  return HEADER_BYTES + buf.readUInt32LE(12) + buf.readUInt32LE(16);
}

/**
 * Where a frame's data section should be written, chosen once its meta is known. The daemon
 * uses it to receive a PUT's bytes straight into an arena reservation (one copy, socket →
 * arena) instead of into a temporary Buffer first.
 */
export type DataSink = (
  op: number,
  meta: Record<string, unknown>,
  dataLen: number,
  id: number,
) => { buf: Buffer; token: number } | null;

interface Partial_ {
  op: number;
  flags: number;
  id: number;
  metaLen: number;
  dataLen: number;
  /** Meta bytes while gathering them. */
  metaBuf: Buffer;
  meta: Record<string, unknown> | null;
  data: Buffer | null;
  token?: number;
  filled: number;
}

/**
 * Incremental decoder. Bytes arrive in arbitrary pieces. The meta section is gathered and
 * parsed first; the data section is then copied into one Buffer of exactly its size (or the
 * sink's destination), so a 16 MiB PUT is copied once from the socket's chunks and never
 * re-concatenated. A reader may instead have the data section read straight into the sink's
 * destination (sinkRemainder / advanceSink), skipping that copy too.
 */
export class FrameDecoder {
  private readonly maxData: number;
  private readonly expectResponses;
  private readonly sink?: DataSink;
  private head: Buffer = EMPTY;
  private cur: Partial_ | null = null;
  /**
   * A tighter bound on meta + data together, checked at the header like the others. The
   * daemon sets it on a TCP connection until its HELLO is accepted, so an unauthenticated
   * peer cannot make it allocate a large frame (the meta and data buffers are allocated as
   * soon as the header declares them).
   */
  frameLimit?: number;

  constructor(maxData: number, expectResponses = false, sink?: DataSink) {
    this.maxData = maxData;
    this.expectResponses = expectResponses;
    this.sink = sink;
  }

  /**
   * Feeds bytes; returns the frames completed by them. Throws ProtocolError on violations.
   * Keeps no reference to `chunk` once it returns (whatever it needs later is copied), so the
   * caller may reuse the buffer for the next read: the daemon's direct read path does.
   */
  push(chunk: Buffer): Frame[] {
    const out: Frame[] = [];
    try {
      this.pushInto(chunk, out);
    } catch (e) {
      if (e instanceof ProtocolError && out.length > 0) e.framesBefore = out;
      throw e;
    }
    return out;
  }

  private pushInto(chunk: Buffer, out: Frame[]): void {
    let off = 0;
    for (;;) {
      if (!this.cur) {
        if (off >= chunk.length) break;
        const take = Math.min(HEADER_BYTES - this.head.length, chunk.length - off);
        if (this.head.length === 0 && take === HEADER_BYTES) {
          // A whole header in this chunk: parsed in place, never stored.
          this.cur = this.startFrame(chunk.subarray(off, off + take));
          off += take;
        } else {
          // A split header is gathered in a copy (Buffer.concat allocates).
          this.head = Buffer.concat([this.head, chunk.subarray(off, off + take)]);
          off += take;
          if (this.head.length < HEADER_BYTES) break;
          const h = this.head;
          this.head = EMPTY;
          this.cur = this.startFrame(h);
        }
      }
      const cur = this.cur;
      if (cur.meta === null) {
        const take = Math.min(cur.metaLen - cur.filled, chunk.length - off);
        chunk.copy(cur.metaBuf, cur.filled, off, off + take);
        cur.filled += take;
        off += take;
        if (cur.filled < cur.metaLen) break;
        cur.meta = parseMeta(cur.metaBuf);
        cur.filled = 0;
        const sunk = this.sink && cur.dataLen > 0 ? this.sink(cur.op, cur.meta, cur.dataLen, cur.id) : null;
        if (sunk && sunk.buf.length === cur.dataLen) {
          cur.data = sunk.buf;
          cur.token = sunk.token;
        } else cur.data = Buffer.allocUnsafe(cur.dataLen);
      }
      const data = cur.data!;
      const take = Math.min(cur.dataLen - cur.filled, chunk.length - off);
      if (take > 0) chunk.copy(data, cur.filled, off, off + take);
      cur.filled += take;
      off += take;
      if (cur.filled < cur.dataLen) break;
      out.push({ op: cur.op, flags: cur.flags, id: cur.id, meta: cur.meta, data, sinkToken: cur.token });
      this.cur = null;
    }
  }

  /**
   * The part of the current frame's sink destination not yet filled, or null when the next
   * bytes are not sink data. A reader may read the socket straight into it and then report
   * the byte count with advanceSink instead of calling push.
   */
  sinkRemainder(): Buffer | null {
    const cur = this.cur;
    if (!cur || cur.meta === null || cur.token === undefined || cur.filled >= cur.dataLen) return null;
    return cur.data!.subarray(cur.filled, cur.dataLen);
  }

  /** Accounts for `n` bytes written into sinkRemainder(); returns the frame if they completed it. */
  advanceSink(n: number): Frame[] {
    const cur = this.cur;
    if (!cur || cur.meta === null || cur.token === undefined || n <= 0 || cur.filled + n > cur.dataLen)
      throw new ProtocolError("no sink destination for these bytes");
    cur.filled += n;
    if (cur.filled < cur.dataLen) return [];
    this.cur = null;
    return [
      { op: cur.op, flags: cur.flags, id: cur.id, meta: cur.meta, data: cur.data!, sinkToken: cur.token },
    ];
  }

  private startFrame(h: Buffer): Partial_ {
    if (h.readUInt32LE(0) !== MAGIC) throw new ProtocolError("bad magic");
    const op = h.readUInt8(4);
    const flags = h.readUInt8(5);
    if (!OP_CODES.has(op)) throw new ProtocolError(`unknown op ${op}`);
    const isResponse = (flags & FLAG_RESPONSE) !== 0;
    if (isResponse !== this.expectResponses) throw new ProtocolError("unexpected frame direction");
    const id = h.readUInt32LE(8);
    const metaLen = h.readUInt32LE(12);
    const dataLen = h.readUInt32LE(16);
    if (metaLen > MAX_META_BYTES)
      throw new FrameTooLargeError(
        `meta of ${metaLen} bytes exceeds ${MAX_META_BYTES}`,
        op,
        id,
        MAX_META_BYTES,
      );
    if (this.frameLimit !== undefined && metaLen + dataLen > this.frameLimit)
      throw new FrameTooLargeError(
        `a frame of ${metaLen + dataLen} bytes before authentication exceeds ${this.frameLimit}`,
        op,
        id,
        this.frameLimit,
      );
    if (dataLen > this.maxData)
      throw new FrameTooLargeError(
        `data of ${dataLen} bytes exceeds the frame limit of ${this.maxData} (max_frame_bytes)`,
        op,
        id,
        this.maxData,
      );
    return {
      op,
      flags,
      id,
      metaLen,
      dataLen,
      metaBuf: Buffer.allocUnsafe(metaLen),
      meta: null,
      data: null,
      filled: 0,
    };
  }
}

function parseMeta(b: Buffer): Record<string, unknown> {
  let meta: unknown;
  try {
    meta = b.length === 0 ? {} : JSON.parse(b.toString("utf8"));
  } catch {
    throw new ProtocolError("meta is not valid JSON");
  }
  if (meta === null || typeof meta !== "object" || Array.isArray(meta)) {
    throw new ProtocolError("meta must be a JSON object");
  }
  return meta as Record<string, unknown>;
}
