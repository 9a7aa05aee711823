/**
 * A small msgpack reader for KV event payloads: the general decoder's (./events.ts) and the
 * batch decoder's (./batch-decode.ts) reader for side fields and odd events. Compared with a
 * general msgpack library it reads 64-bit integers straight into doubles (block hashes need no
 * BigInt), keeps `bin` values as views into the payload, and decodes short ASCII strings
 * without TextDecoder. Throws `RangeError` on truncated or unsupported input; callers catch it.
 */
const utf8 = new TextDecoder("utf-8", { fatal: false });
const TWO32 = 4294967296;
const BLOCK_STORED = new TextEncoder().encode("BlockStored");

export class MsgpackReader {
  private buf: Uint8Array;
  private pos = 0;
  private view: DataView;

  constructor(buf: Uint8Array) {
    this.buf = buf;
    // To the end of the underlying buffer, so `reset` can keep it; reads stop at `buf`'s end.
    this.view = new DataView(buf.buffer, buf.byteOffset);
  }

  /**
   * Reads `buf` from its start. The DataView is kept when `buf` starts where the last one did
   * (a receive buffer reused message after message): one object less per payload.
   */
  reset(buf: Uint8Array): void {
    this.buf = buf;
    this.pos = 0;
    const v = this.view;
    if (v.buffer !== buf.buffer || v.byteOffset !== buf.byteOffset || v.byteLength < buf.byteLength)
      this.view = new DataView(buf.buffer, buf.byteOffset);
  }

  /** Where the next value starts. */
  get position(): number {
    return this.pos;
  }

  /** Moves to byte `pos` (the start of a value). */
  seek(pos: number): void {
    this.pos = pos;
  }

  get done(): boolean {
    return this.pos >= this.buf.length;
  }

  private need(n: number): void {
    if (this.pos + n > this.buf.length) throw new RangeError("msgpack: truncated input");
  }

  private str(n: number): string {
    this.need(n);
    const b = this.buf;
    const start = this.pos;
    this.pos += n;
    // The strings every event repeats, without building them byte by byte.
    if (n === 3 && b[start + 1] === 0x50 && b[start + 2] === 0x55) {
      if (b[start] === 0x47) return "GPU";
      if (b[start] === 0x43) return "CPU";
    }
    if (n === 11 && b[start] === 0x42 && b[start + 5] === 0x53) {
      let same = true;
      for (let i = 1; i < 11; i++) if (b[start + i] !== BLOCK_STORED[i]) same = false;
      if (same) return "BlockStored";
    }
    if (n < 32) {
      let s = "";
      for (let i = start; i < start + n; i++) {
        const c = b[i];
        if (c >= 0x80) return utf8.decode(b.subarray(start, start + n));
        s += String.fromCharCode(c);
      }
      return s;
    }
    return utf8.decode(b.subarray(start, start + n));
  }

  private bin(n: number): Uint8Array {
    this.need(n);
    const out = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  private array(n: number): unknown[] {
    // Every element takes a byte at least: a length past the input is truncation (or a corrupt
    // header), refused before it allocates a 4-billion-slot array.
    this.need(n);
    const out = new Array<unknown>(n);
    for (let i = 0; i < n; i++) out[i] = this.read();
    return out;
  }

  private map(n: number): Record<string, unknown> {
    this.need(2 * n);
    const out: Record<string, unknown> = {};
    for (let i = 0; i < n; i++) {
      const k = this.read();
      out[typeof k === "string" ? k : String(k)] = this.read();
    }
    return out;
  }

  /** Reads one value. */
  read(): unknown {
    this.need(1);
    const v = this.view;
    const t = this.buf[this.pos++];
    if (t < 0x80) return t;
    if (t < 0x90) return this.map(t & 0x0f);
    if (t < 0xa0) return this.array(t & 0x0f);
    if (t < 0xc0) return this.str(t & 0x1f);
    if (t >= 0xe0) return t - 0x100;
    let p = this.pos;
    switch (t) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xc4:
        this.need(1);
        this.pos++;
        return this.bin(v.getUint8(p));
      case 0xc5:
        this.need(2);
        this.pos += 2;
        return this.bin(v.getUint16(p));
      case 0xc6:
        this.need(4);
        this.pos += 4;
        return this.bin(v.getUint32(p));
      case 0xca:
        this.need(4);
        this.pos += 4;
        return v.getFloat32(p);
      case 0xcb:
        this.need(8);
        this.pos += 8;
        return v.getFloat64(p);
      case 0xcc:
        this.need(1);
        this.pos++;
        return v.getUint8(p);
      case 0xcd:
        this.need(2);
        this.pos += 2;
        return v.getUint16(p);
      case 0xce:
        this.need(4);
        this.pos += 4;
        return v.getUint32(p);
      case 0xcf:
        this.need(8);
        this.pos += 8;
        return v.getUint32(p) * TWO32 + v.getUint32(p + 4);
      case 0xd0:
        this.need(1);
        this.pos++;
        return v.getInt8(p);
      case 0xd1:
        this.need(2);
        this.pos += 2;
        return v.getInt16(p);
      case 0xd2:
        this.need(4);
        this.pos += 4;
        return v.getInt32(p);
      case 0xd3:
        this.need(8);
        this.pos += 8;
        return v.getInt32(p) * TWO32 + v.getUint32(p + 4);
      case 0xd9:
        this.need(1);
        this.pos++;
        return this.str(v.getUint8(p));
      case 0xda:
        this.need(2);
        this.pos += 2;
        return this.str(v.getUint16(p));
      case 0xdb:
        this.need(4);
        this.pos += 4;
        return this.str(v.getUint32(p));
      case 0xdc:
        this.need(2);
        this.pos += 2;
        return this.array(v.getUint16(p));
      case 0xdd:
        this.need(4);
        this.pos += 4;
        return this.array(v.getUint32(p));
      case 0xde:
        this.need(2);
        this.pos += 2;
        return this.map(v.getUint16(p));
      case 0xdf:
        this.need(4);
        this.pos += 4;
        return this.map(v.getUint32(p));
      default: {
        // ext types (timestamps etc.): skipped as opaque bytes.
        let n: number;
        if (t >= 0xd4 && t <= 0xd8) n = 1 << (t - 0xd4);
        else if (t === 0xc7) {
          this.need(1);
          n = v.getUint8(p);
          p += 1;
        } else if (t === 0xc8) {
          this.need(2);
          n = v.getUint16(p);
          p += 2;
        } else if (t === 0xc9) {
          this.need(4);
          n = v.getUint32(p);
          p += 4;
        } else throw new RangeError(`msgpack: unsupported type byte 0x${t.toString(16)}`);
        this.pos = p + 1; // the ext type byte
        return this.bin(n);
      }
    }
  }
}

/** Decodes one msgpack value occupying the whole buffer. */
export function unpackValue(buf: Uint8Array): unknown {
  const r = new MsgpackReader(buf);
  const v = r.read();
  if (!r.done) throw new RangeError("msgpack: trailing bytes after the value");
  return v;
}
