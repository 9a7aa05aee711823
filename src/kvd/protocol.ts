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

export const FLAG_RESPONSE = 0x1;
export const FLAG_ERROR = 0x2;

export interface Frame {
  op: number;
  flags: number;
  id: number;
  meta: Record<string, unknown>;
  data: Buffer;
}

/** A framing violation: the connection that sent it is closed (the daemon keeps running). */
export class ProtocolError extends Error {}

export function encodeFrame(
  op: number,
  flags: number,
  id: number,
  meta: object,
  data?: Buffer | Buffer[],
): Buffer[] {
  const metaBuf = Buffer.from(JSON.stringify(meta), "utf8");
  const parts = data === undefined ? [] : Array.isArray(data) ? data : [data];
  let dataLen = 0;
  for (const p of parts) dataLen += p.length;
  const h = Buffer.allocUnsafe(HEADER_BYTES);
  h.writeUInt32LE(MAGIC, 0);
  h.writeUInt8(op, 4);
  h.writeUInt8(flags, 5);
  h.writeUInt16LE(0, 6);
  h.writeUInt32LE(id >>> 0, 8);
  h.writeUInt32LE(metaBuf.length, 12);
  h.writeUInt32LE(dataLen, 16);
  return [h, metaBuf, ...parts];
}

/** Total frame length if `buf` starts with a complete header, else -1. Throws on bad magic. */
export function frameLength(buf: Buffer): number {
  if (buf.length < HEADER_BYTES) return -1;
  if (buf.readUInt32LE(0) !== MAGIC) throw new ProtocolError("bad magic");
  return HEADER_BYTES + buf.readUInt32LE(12) + buf.readUInt32LE(16);
}

/**
 * Incremental decoder. Bytes arrive in arbitrary pieces; a frame's data section is gathered
 * into one Buffer of exactly its size, allocated when the header arrives, so a 16 MiB PUT is
 * copied once from the socket's chunks and never re-concatenated.
 */
export class FrameDecoder {
  private head: Buffer = Buffer.alloc(0);
  private cur: {
    op: number;
    flags: number;
    id: number;
    metaLen: number;
    body: Buffer;
    filled: number;
  } | null = null;

  constructor(
    private readonly maxData: number,
    private readonly expectResponses = false,
  ) {}

  /** Feeds bytes; returns the frames completed by them. Throws ProtocolError on violations. */
  push(chunk: Buffer): Frame[] {
    const out: Frame[] = [];
    let off = 0;
    while (off < chunk.length) {
      if (!this.cur) {
        const need = HEADER_BYTES - this.head.length;
        const take = Math.min(need, chunk.length - off);
        this.head =
          this.head.length === 0 && take === HEADER_BYTES
            ? chunk.subarray(off, off + take)
            : Buffer.concat([this.head, chunk.subarray(off, off + take)]);
        off += take;
        if (this.head.length < HEADER_BYTES) break;
        this.cur = this.startFrame(this.head);
        this.head = Buffer.alloc(0);
      }
      const cur = this.cur;
      const take = Math.min(cur.body.length - cur.filled, chunk.length - off);
      chunk.copy(cur.body, cur.filled, off, off + take);
      cur.filled += take;
      off += take;
      if (cur.filled === cur.body.length) {
        out.push(this.finishFrame(cur));
        this.cur = null;
      }
    }
    return out;
  }

  private startFrame(h: Buffer) {
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
      throw new ProtocolError(`meta of ${metaLen} bytes exceeds ${MAX_META_BYTES}`);
    if (dataLen > this.maxData) throw new ProtocolError(`data of ${dataLen} bytes exceeds ${this.maxData}`);
    return { op, flags, id, metaLen, body: Buffer.allocUnsafe(metaLen + dataLen), filled: 0 };
  }

  private finishFrame(cur: { op: number; flags: number; id: number; metaLen: number; body: Buffer }): Frame {
    let meta: unknown;
    try {
      meta = cur.metaLen === 0 ? {} : JSON.parse(cur.body.toString("utf8", 0, cur.metaLen));
    } catch {
      throw new ProtocolError("meta is not valid JSON");
    }
    if (meta === null || typeof meta !== "object" || Array.isArray(meta)) {
      throw new ProtocolError("meta must be a JSON object");
    }
    return {
      op: cur.op,
      flags: cur.flags,
      id: cur.id,
      meta: meta as Record<string, unknown>,
      data: cur.body.subarray(cur.metaLen),
    };
  }
}
