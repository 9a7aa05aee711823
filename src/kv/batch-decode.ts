/**
 * The hot path of KV event decoding: an `EventBatch` read straight from the msgpack bytes into
 * events, for the layouts the engines send (docs/engine-protocols.md#kv-events-payload):
 * - the batch as an array `[ts, events, dp_rank?]` (SGLang, ATOM, older vLLM) or a map
 *   `{ts, events, data_parallel_rank?}` (vLLM's `EventBatch`, omit_defaults map form);
 * - each event as an array `[tag, ...fields]` (array_like structs) or a map with the tag under
 *   `type` (vLLM's `KVCacheEvent`, tag=True);
 * - block hashes as uint64 / int64 (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, SGLang, ATOM)
 *   or bytes (vLLM's default sha256 digests), folded in place without a view per hash.
 *
 * Block hashes, the parent hash and the token ids (nearly all of a batch's bytes) are read
 * byte by byte into their final arrays; no generic array or map is built for an event. The
 * side fields (block size, medium, LoRA, extra keys, ...) are read as the general reader reads
 * them and go through the same builders as the general decoder (./event-model.ts).
 *
 * Exactness: this decoder never decides that something is wrong. An event whose shape it does
 * not know (other tags, floats or strings as hashes, a tag that is not a string, a `__proto__`
 * key, ...) is re-read from its first byte the general way (`MsgpackReader.read` then
 * `decodeEvent`), and a batch it cannot follow (truncated, trailing bytes, not an array or
 * map, duplicate `events`) makes it return null so the caller runs the general decoder, which
 * also produces the error. So an event it returns is the event the general decoder would
 * return, and malformed input is rejected by the same code either way (test/kv/batch-decode.test.ts
 * checks both on randomized batches).
 */
import {
  cleared,
  decodeEvent,
  type EngineHash,
  type EventBatch,
  foldRange,
  int,
  type KvEvent,
  offloadMedium,
  removedEvent,
  storedEvent,
  transferredEvent,
} from "./event-model.ts";
import { MsgpackReader } from "./msgpack-read.ts";

const TWO32 = 4294967296;

/**
 * A fixed set of ASCII names → ids, looked up by the bytes of a msgpack str: a 256-slot table
 * on (length, first byte, last byte), chained, each candidate confirmed byte by byte. No string
 * is built for a key or a tag.
 */
class Names {
  private readonly names: Uint8Array[] = [];
  private readonly ids: number[] = [];
  private readonly next: number[] = [];
  private readonly heads = new Int16Array(256).fill(-1);

  constructor(list: [string, number][]) {
    for (const [s, id] of list) {
      const bytes = Uint8Array.from(s, (c) => c.charCodeAt(0));
      const slot = Names.slot(bytes, 0, bytes.length);
      this.names.push(bytes);
      this.ids.push(id);
      this.next.push(this.heads[slot]);
      this.heads[slot] = this.names.length - 1;
    }
  }

  private static slot(b: Uint8Array, at: number, n: number): number {
    return n === 0 ? 0 : (n * 41 + b[at] * 7 + b[at + n - 1] * 3) & 255;
  }

  /** The id of the name `b[at, at + n)`, or `none`. */
  find(b: Uint8Array, at: number, n: number, none: number): number {
    let i = this.heads[Names.slot(b, at, n)];
    while (i >= 0) {
      const name = this.names[i];
      if (name.length === n && sameBytes(b, at, name)) return this.ids[i];
      i = this.next[i];
    }
    return none;
  }
}

// Tags and map keys, compared as bytes (no string is built for them).
const T_STORED = 1;
const T_REMOVED = 2;
const T_CLEARED = 3;
const T_TRANSFERRED = 4;
const TAGS = new Names([
  ["BlockStored", T_STORED],
  ["BlockRemoved", T_REMOVED],
  ["AllBlocksCleared", T_CLEARED],
  ["BlockTransferred", T_TRANSFERRED],
]);

/** A hash-only store or a removal of another medium than GPU memory. */
function offloadHashOnly(ev: KvEvent): boolean {
  if (ev.type === "BlockStored") return ev.tokenIds.length === 0 && offloadMedium(ev.medium);
  return ev.type === "BlockRemoved" && offloadMedium(ev.medium);
}

// Map keys of events and batches; K_OTHER: a key read past; K_BAIL: one the general way must read.
const K_OTHER = 0;
const K_BAIL = -1;
const K_TYPE = 1;
const K_TAG = 2;
const K_HASHES = 3;
const K_PARENT = 4;
const K_TOKENS = 5;
const K_BLOCK_SIZE = 6;
const K_LORA_ID = 7;
const K_MEDIUM = 8;
const K_LORA_NAME = 9;
const K_METADATA = 10;
const K_EXTRA = 11;
const K_GROUP = 12;
const K_SPEC_KIND = 13;
const K_WINDOW = 14;
const K_FROM = 15;
const K_TO = 16;
const K_TS = 17;
const K_EVENTS = 18;
const K_DP = 19;
const K_DP_SHORT = 20;
const KEYS = new Names([
  ["type", K_TYPE],
  ["tag", K_TAG],
  ["block_hashes", K_HASHES],
  ["parent_block_hash", K_PARENT],
  ["token_ids", K_TOKENS],
  ["block_size", K_BLOCK_SIZE],
  ["lora_id", K_LORA_ID],
  ["medium", K_MEDIUM],
  ["lora_name", K_LORA_NAME],
  ["metadata", K_METADATA],
  ["extra_keys", K_EXTRA],
  ["group_idx", K_GROUP],
  ["kv_cache_spec_kind", K_SPEC_KIND],
  ["kv_cache_spec_sliding_window", K_WINDOW],
  ["from_medium", K_FROM],
  ["to_medium", K_TO],
  ["ts", K_TS],
  ["events", K_EVENTS],
  ["data_parallel_rank", K_DP],
  ["dp_rank", K_DP_SHORT],
  // As a key of a plain object it would set the prototype: left to the general decoder.
  ["__proto__", K_BAIL],
]);

/** Thrown (a shared instance, no stack) when the batch cannot be followed: the caller falls back. */
class Bail extends Error {}
const BAIL = new Bail("batch-decode: not followed");

function sameBytes(b: Uint8Array, at: number, name: Uint8Array): boolean {
  for (let i = 0; i < name.length; i++) if (b[at + i] !== name[i]) return false;
  return true;
}

/**
 * Decodes one payload; null when the general decoder must (see the module comment). One
 * instance per thread of use: it keeps the payload between calls of its methods.
 */
export class BatchDecoder {
  private b: Uint8Array = new Uint8Array(0);
  private p = 0;
  private end = 0;
  private r: MsgpackReader = new MsgpackReader(this.b);
  /** Cleared by a hot-field reader that met a value it does not take: the event goes the general way. */
  private ok = true;

  decode(payload: Uint8Array): EventBatch | null {
    this.b = payload;
    this.p = 0;
    this.end = payload.length;
    // One reader for every payload (reset, not made anew); it keeps a view of the last one.
    this.r.reset(payload);
    try {
      const out = this.batch();
      return this.p === this.end ? out : null;
    } catch {
      // Bail, or the general reader's RangeError on truncated input: the general decoder decides.
      return null;
    } finally {
      this.b = EMPTY;
    }
  }

  private batch(): EventBatch | null {
    const t = this.byte();
    if (t >= 0x90 && t <= 0x9f) {
      this.p++;
      return this.arrayBatch(t & 0x0f);
    }
    if (t === 0xdc || t === 0xdd) return this.arrayBatch(this.bigLength(t === 0xdc ? 2 : 4));
    if (t >= 0x80 && t <= 0x8f) {
      this.p++;
      return this.mapBatch(t & 0x0f);
    }
    if (t === 0xde || t === 0xdf) return this.mapBatch(this.bigLength(t === 0xde ? 2 : 4));
    return null;
  }

  /** `[ts, events, dp?, ...]` as the general decoder reads it (`[ts, events, dp] = raw`). */
  private arrayBatch(n: number): EventBatch | null {
    if (n < 2) return null;
    const ts = this.value();
    const out: KvEvent[] = [];
    const skipped = this.events(out);
    const dp = n > 2 ? this.value() : null;
    for (let i = 3; i < n; i++) this.value();
    return { ts: typeof ts === "number" ? ts : 0, events: out, dpRank: int(dp), skipped };
  }

  /** `{ts, events, data_parallel_rank | dp_rank}`; later duplicates win, as in an object. */
  private mapBatch(n: number): EventBatch | null {
    let ts: unknown;
    let dp: unknown;
    let dpShort: unknown;
    let out: KvEvent[] | null = null;
    let skipped = 0;
    for (let i = 0; i < n; i++) {
      const k = this.key();
      if (k === K_TS) ts = this.value();
      else if (k === K_DP) dp = this.value();
      else if (k === K_DP_SHORT) dpShort = this.value();
      else if (k === K_EVENTS) {
        if (out !== null) throw BAIL;
        out = [];
        skipped = this.events(out);
      } else if (k === K_BAIL) throw BAIL;
      else this.value();
    }
    if (out === null) return null;
    return { ts: typeof ts === "number" ? ts : 0, events: out, dpRank: int(dp ?? dpShort), skipped };
  }

  /** The events list (must be an array, else the general decoder says so); returns the skipped count. */
  private events(out: KvEvent[]): number {
    const m = this.arrayLength();
    if (m < 0) throw BAIL;
    let skipped = 0;
    for (let e = 0; e < m; e++) {
      const start = this.p;
      this.ok = true;
      let ev: KvEvent | null = null;
      const t = this.byte();
      if (t >= 0x90 && t <= 0x9f) {
        this.p++;
        ev = this.arrayEvent(t & 0x0f);
      } else if (t >= 0x80 && t <= 0x8f) {
        this.p++;
        ev = this.mapEvent(t & 0x0f);
      } else if (t === 0xdc || t === 0xdd) ev = this.arrayEvent(this.bigLength(t === 0xdc ? 2 : 4));
      else if (t === 0xde || t === 0xdf) ev = this.mapEvent(this.bigLength(t === 0xde ? 2 : 4));
      else this.ok = false;
      if (!this.ok) ev = this.general(start);
      // An offloaded tier's event keeps its hashes' raw bytes (event-model.ts OffloadHashBytes),
      // which only the general reader has; such events are few.
      else if (ev && offloadHashOnly(ev)) ev = this.general(start);
      if (ev) out.push(ev);
      else skipped++;
    }
    return skipped;
  }

  /** The event at `start` read the general way. */
  private general(start: number): KvEvent | null {
    const r = this.r;
    r.seek(start);
    const raw = r.read();
    this.p = r.position;
    return decodeEvent(raw);
  }

  /** A positional event; sets `ok` false for a shape only the general decoder takes. */
  private arrayEvent(c: number): KvEvent | null {
    if (c === 0) {
      this.ok = false;
      return null;
    }
    const tag = this.tag();
    if (tag === 0) {
      this.ok = false;
      return null;
    }
    if (tag === T_STORED) {
      if (c < 4) {
        this.ok = false;
        return null;
      }
      const hashes = this.hashArray();
      if (!this.ok) return null;
      const parent = this.parent();
      if (!this.ok) return null;
      const tokens = this.numberArray();
      if (!this.ok) return null;
      const bs = c > 4 ? this.value() : null;
      const loraId = c > 5 ? this.value() : null;
      const medium = c > 6 ? this.value() : null;
      const loraName = c > 7 ? this.value() : null;
      const extraKeys = c > 8 ? this.value() : null;
      const groupIdx = c > 9 ? this.value() : null;
      const specKind = c > 10 ? this.value() : null;
      const window = c > 11 ? this.value() : null;
      for (let i = 12; i < c; i++) this.value();
      return storedEvent(
        hashes as EngineHash[],
        parent,
        tokens as number[],
        bs,
        loraId,
        medium,
        loraName,
        extraKeys,
        groupIdx,
        specKind,
        window,
      );
    }
    if (tag === T_CLEARED) {
      const medium = c > 1 ? this.value() : null;
      for (let i = 2; i < c; i++) this.value();
      return cleared(medium);
    }
    if (c < 2) {
      this.ok = false;
      return null;
    }
    const hashes = this.hashArray();
    if (!this.ok) return null;
    const f2 = c > 2 ? this.value() : null;
    const f3 = c > 3 ? this.value() : null;
    if (tag === T_REMOVED) {
      for (let i = 4; i < c; i++) this.value();
      return removedEvent(hashes as EngineHash[], f2, f3);
    }
    const f4 = c > 4 ? this.value() : null;
    for (let i = 5; i < c; i++) this.value();
    return transferredEvent(hashes as EngineHash[], f2, f3, f4);
  }

  /**
   * A map event, read field by field (later duplicates win, as in an object). The tag may come
   * anywhere, so the hot fields are read whatever it is; one this reader does not take sends
   * the event the general way, which is then right whether the tag needs the field or not.
   */
  // long: the hot path for vLLM's map-form events; each field lands in a local the builder
  // call then takes, so no per-event fields object is allocated or passed between helpers.
  private mapEvent(n: number): KvEvent | null {
    // Tag ids of `type` and `tag`: 0 when absent or nil (then `type ?? tag`, as the general
    // decoder reads them); any other value sends the event the general way.
    let type = 0;
    let tagV = 0;
    let hashes: EngineHash[] | null = null;
    let parent: EngineHash | null = null;
    let tokens: number[] | null = null;
    let bs: unknown;
    let loraId: unknown;
    let medium: unknown;
    let loraName: unknown;
    let metadata: unknown;
    let extraKeys: unknown;
    let groupIdx: unknown;
    let specKind: unknown;
    let window: unknown;
    let from: unknown;
    let to: unknown;
    for (let i = 0; i < n; i++) {
      const k = this.key();
      switch (k) {
        case K_TYPE:
          type = this.tagOrNil();
          break;
        case K_TAG:
          tagV = this.tagOrNil();
          break;
        case K_HASHES:
          hashes = this.hashArray();
          break;
        case K_PARENT:
          parent = this.parent();
          break;
        case K_TOKENS:
          tokens = this.numberArray();
          break;
        case K_BLOCK_SIZE:
          bs = this.value();
          break;
        case K_LORA_ID:
          loraId = this.value();
          break;
        case K_MEDIUM:
          medium = this.value();
          break;
        case K_LORA_NAME:
          loraName = this.value();
          break;
        case K_METADATA:
          metadata = this.value();
          break;
        case K_EXTRA:
          extraKeys = this.value();
          break;
        case K_GROUP:
          groupIdx = this.value();
          break;
        case K_SPEC_KIND:
          specKind = this.value();
          break;
        case K_WINDOW:
          window = this.value();
          break;
        case K_FROM:
          from = this.value();
          break;
        case K_TO:
          to = this.value();
          break;
        case K_BAIL:
          this.ok = false;
          break;
        default:
          this.value();
      }
      if (!this.ok) return null;
    }
    switch (type !== 0 ? type : tagV) {
      case T_STORED:
        if (hashes === null || tokens === null) break;
        return storedEvent(
          hashes,
          parent,
          tokens,
          bs,
          loraId,
          medium,
          loraName ?? metadata,
          extraKeys,
          groupIdx,
          specKind,
          window,
        );
      case T_REMOVED:
        if (hashes === null) break;
        return removedEvent(hashes, medium, groupIdx);
      case T_CLEARED:
        return cleared(medium);
      case T_TRANSFERRED:
        if (hashes === null) break;
        return transferredEvent(hashes, from, to, groupIdx);
    }
    // Unknown tag or a missing field: the general decoder gives its verdict.
    this.ok = false;
    return null;
  }

  // ---- bytes

  private byte(): number {
    if (this.p >= this.end) throw BAIL;
    return this.b[this.p];
  }

  /** Length after a 0xdc/0xdd (0xde/0xdf) type byte at `p` of `w` bytes; consumes header. */
  private bigLength(w: number): number {
    const b = this.b;
    const p = this.p;
    if (p + 1 + w > this.end) throw BAIL;
    const n =
      w === 2
        ? (b[p + 1] << 8) | b[p + 2]
        : ((b[p + 1] << 24) | (b[p + 2] << 16) | (b[p + 3] << 8) | b[p + 4]) >>> 0;
    this.p = p + 1 + w;
    // Each element takes a byte at least: a longer length is truncation, refused before the
    // array for it is allocated.
    if (n > this.end - this.p) throw BAIL;
    return n;
  }

  /** An array header's length (consumed), or -1 (nothing consumed). */
  private arrayLength(): number {
    const t = this.byte();
    if (t >= 0x90 && t <= 0x9f) {
      this.p++;
      const n = t & 0x0f;
      if (n > this.end - this.p) throw BAIL;
      return n;
    }
    if (t === 0xdc || t === 0xdd) return this.bigLength(t === 0xdc ? 2 : 4);
    return -1;
  }

  /** A positional event's tag (a str compared as bytes), or 0 (nothing known) for anything else. */
  private tag(): number {
    const b = this.b;
    const p = this.p;
    const t = this.byte();
    if (t < 0xa0 || t > 0xbf) return 0;
    const n = t & 0x1f;
    if (p + 1 + n > this.end) throw BAIL;
    const id = TAGS.find(b, p + 1, n, 0);
    if (id !== 0) this.p = p + 1 + n;
    return id;
  }

  /** A map event's tag value: its id, 0 for nil; ok cleared for anything else (an unknown tag too). */
  private tagOrNil(): number {
    if (this.byte() === 0xc0) {
      this.p++;
      return 0;
    }
    const id = this.tag();
    if (id === 0) this.ok = false;
    return id;
  }

  /** A map key: which field it names (K_OTHER for one not read here; K_BAIL: not a plain str key). */
  private key(): number {
    const b = this.b;
    const p = this.p;
    const t = this.byte();
    let n: number;
    let at: number;
    if (t >= 0xa0 && t <= 0xbf) {
      n = t & 0x1f;
      at = p + 1;
    } else if (t === 0xd9) {
      if (p + 2 > this.end) throw BAIL;
      n = b[p + 1];
      at = p + 2;
    } else throw BAIL; // int/bin keys become strings in an object: the general decoder's business
    if (at + n > this.end) throw BAIL;
    this.p = at + n;
    return KEYS.find(b, at, n, K_OTHER);
  }

  /** Any value, the general reader's way (nil and small ints without a call). */
  private value(): unknown {
    const t = this.byte();
    if (t === 0xc0) {
      this.p++;
      return null;
    }
    if (t < 0x80) {
      this.p++;
      return t;
    }
    const r = this.r;
    r.seek(this.p);
    const v = r.read();
    this.p = r.position;
    return v;
  }

  /** A parent hash: nil → null, else a hash (ok cleared for what the general decoder must judge). */
  private parent(): EngineHash | null {
    if (this.byte() === 0xc0) {
      this.p++;
      return null;
    }
    return this.hash();
  }

  /** An array of block hashes (ints or bytes); null with ok cleared for anything else. */
  private hashArray(): EngineHash[] | null {
    const n = this.arrayLength();
    if (n < 0) {
      // A single hash instead of a list: the general decoder takes it.
      this.ok = false;
      return null;
    }
    const out = new Array<EngineHash>(n);
    for (let i = 0; i < n; i++) {
      out[i] = this.hash();
      if (!this.ok) return null;
    }
    return out;
  }

  /**
   * One block hash as the general decoder normalises it: an int as the number it decodes to
   * (uint64 above 2^53 rounded the same way), bytes folded in place. Floats, strings etc.: ok
   * cleared (the general decoder judges them).
   */
  private hash(): EngineHash {
    const b = this.b;
    const p = this.p;
    const t = this.byte();
    if (t < 0x80) {
      this.p = p + 1;
      return t;
    }
    if (t >= 0xe0) {
      this.p = p + 1;
      return t - 0x100;
    }
    if (t === 0xc4) {
      if (p + 2 > this.end) throw BAIL;
      const n = b[p + 1];
      if (p + 2 + n > this.end) throw BAIL;
      this.p = p + 2 + n;
      return foldRange(b, p + 2, p + 2 + n);
    }
    const v = this.int(t, p);
    if (Number.isNaN(v)) {
      this.ok = false;
      return 0;
    }
    return v + 0;
  }

  /** An array of numbers (token ids); null with ok cleared for anything else. */
  private numberArray(): number[] | null {
    const n = this.arrayLength();
    if (n < 0) {
      this.ok = false;
      return null;
    }
    const b = this.b;
    const end = this.end;
    const out = new Array<number>(n);
    let p = this.p;
    for (let i = 0; i < n; i++) {
      if (p >= end) throw BAIL;
      const t = b[p];
      // Token ids: fixint, uint16 and uint32 are nearly all of them.
      if (t < 0x80) {
        out[i] = t;
        p++;
      } else if (t === 0xcd) {
        if (p + 3 > end) throw BAIL;
        out[i] = (b[p + 1] << 8) | b[p + 2];
        p += 3;
      } else if (t === 0xce) {
        if (p + 5 > end) throw BAIL;
        out[i] = ((b[p + 1] << 24) | (b[p + 2] << 16) | (b[p + 3] << 8) | b[p + 4]) >>> 0;
        p += 5;
      } else {
        this.p = p;
        let v = this.int(t, p);
        if (Number.isNaN(v)) v = this.float(t, p);
        if (Number.isNaN(v) && t !== 0xca && t !== 0xcb) {
          this.ok = false;
          return null;
        }
        out[i] = v;
        p = this.p;
      }
    }
    this.p = p;
    return out;
  }

  /**
   * An integer at `p` (type byte `t`) as the general reader decodes it, consumed; NaN (nothing
   * consumed) when it is not an integer.
   */
  private int(t: number, p: number): number {
    const b = this.b;
    if (t < 0x80) {
      this.p = p + 1;
      return t;
    }
    if (t >= 0xe0) {
      this.p = p + 1;
      return t - 0x100;
    }
    let w: number;
    if (t >= 0xcc && t <= 0xcf) w = 1 << (t - 0xcc);
    else if (t >= 0xd0 && t <= 0xd3) w = 1 << (t - 0xd0);
    else return Number.NaN;
    if (p + 1 + w > this.end) throw BAIL;
    this.p = p + 1 + w;
    const q = p + 1;
    if (t === 0xcc) return b[q];
    if (t === 0xcd) return (b[q] << 8) | b[q + 1];
    if (t === 0xd0) return (b[q] << 24) >> 24;
    if (t === 0xd1) return ((b[q] << 24) | (b[q + 1] << 16)) >> 16;
    const hi = (b[q] << 24) | (b[q + 1] << 16) | (b[q + 2] << 8) | b[q + 3];
    if (t === 0xce) return hi >>> 0;
    if (t === 0xd2) return hi;
    const lo = ((b[q + 4] << 24) | (b[q + 5] << 16) | (b[q + 6] << 8) | b[q + 7]) >>> 0;
    // The general reader's formulas: uint64 hi * 2^32 + lo, int64 with hi signed.
    return (t === 0xcf ? hi >>> 0 : hi) * TWO32 + lo;
  }

  /** A float32/float64 at `p`, consumed; NaN (nothing consumed) for another type. */
  private float(t: number, p: number): number {
    if (t !== 0xca && t !== 0xcb) return Number.NaN;
    const r = this.r;
    r.seek(p);
    const v = r.read() as number;
    this.p = r.position;
    return v;
  }
}

const EMPTY = new Uint8Array(0);
