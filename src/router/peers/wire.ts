/**
 * The announcement's wire format: one frame, `[kind byte] msgpack([v, sender, seq, sentAt,
 * model, worker, tokens, ttlMs, nodes, end?])` and, when kind is SIGNED, a 32-byte HMAC-SHA256 of the
 * msgpack bytes under the replicas' shared secret. `nodes` is the path digest (./table.ts) as
 * little-endian float64s (the path's nodes are 52-bit integers, exact in a double): 8 bytes a
 * node, so a capped digest of 256 nodes is ~2 KiB whatever the prompt's length. A trailing `1`
 * (`end`) retracts an earlier announcement of the same worker and nodes: the sender's own bridge
 * entry ended (confirmed by the events, failed, cancelled, evicted), so its peers stop counting it.
 *
 * Other frame kinds share the framing (`sealFrame`/`openFrame`) and tell themselves apart by the
 * body's first element: 1 an announcement, 2 a load report (./load-wire.ts).
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import { pack, unpack } from "msgpackr";

const VERSION = 1;
const UNSIGNED = 0x01;
const SIGNED = 0x02;
const MAC_BYTES = 32;
/**
 * A frame longer than this is not unpacked: the largest announcement (`peers.maxNodes` 65,536
 * nodes × 8 bytes) and a full load report (1,024 readings) fit well under it.
 */
export const MAX_FRAME_BYTES = 1024 * 1024;

export interface Announcement {
  sender: string;
  seq: number;
  /** Sender's clock, ms since the epoch (the age on arrival is measured against it). */
  sentAt: number;
  model: string;
  worker: string;
  tokens: number;
  ttlMs: number;
  nodes: Float64Array;
  /** This retracts the sender's announcement of the same worker and nodes. */
  end?: boolean;
}

export type Decoded = { ok: true; a: Announcement } | { ok: false; reason: "auth" | "malformed" };

function mac(secret: Buffer, body: Uint8Array): Buffer {
  return createHmac("sha256", secret).update(body).digest();
}

/** `[kind] body [mac]`: the body signed with the secret, or marked unsigned without one. */
export function sealFrame(body: Uint8Array, secret: Buffer | null): Uint8Array {
  if (!secret) return Buffer.concat([Buffer.of(UNSIGNED), body]);
  return Buffer.concat([Buffer.of(SIGNED), body, mac(secret, body)]);
}

export function encodeAnnouncement(a: Announcement, secret: Buffer | null): Uint8Array {
  const nodes = Buffer.from(a.nodes.buffer, a.nodes.byteOffset, a.nodes.byteLength);
  const fields = [VERSION, a.sender, a.seq, a.sentAt, a.model, a.worker, a.tokens, a.ttlMs, nodes];
  return sealFrame(pack(a.end ? [...fields, 1] : fields), secret);
}

export const isStr = (v: unknown): v is string => typeof v === "string" && v.length > 0 && v.length <= 512;
export const isNum = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v) && v >= 0;

/** A frame's checked body: the msgpack array every frame kind is (its first element tells the kind). */
export type Opened = { ok: true; v: unknown[] } | { ok: false; reason: "auth" | "malformed" };

/**
 * With a secret, only a SIGNED frame whose MAC verifies is taken; without one (loopback only),
 * only UNSIGNED frames (a signed one cannot be checked). Nothing a peer sends throws out.
 */
export function openFrame(frame: Uint8Array, secret: Buffer | null): Opened {
  if (frame.length < 2 || frame.length > MAX_FRAME_BYTES) return { ok: false, reason: "malformed" };
  const kind = frame[0];
  let body: Uint8Array;
  if (secret) {
    if (kind !== SIGNED || frame.length < 1 + MAC_BYTES + 1) return { ok: false, reason: "auth" };
    body = frame.subarray(1, frame.length - MAC_BYTES);
    const got = frame.subarray(frame.length - MAC_BYTES);
    if (!timingSafeEqual(mac(secret, body), got)) return { ok: false, reason: "auth" };
  } else {
    if (kind !== UNSIGNED) return { ok: false, reason: "auth" };
    body = frame.subarray(1);
  }
  let v: unknown;
  try {
    v = unpack(body);
  } catch {
    return { ok: false, reason: "malformed" };
  }
  if (!Array.isArray(v)) return { ok: false, reason: "malformed" };
  return { ok: true, v };
}

/** Whether an opened body is an announcement (else another kind, e.g. ./load-wire.ts). */
export const isAnnouncement = (v: unknown[]): boolean => v[0] === VERSION;

/** An opened body as an announcement. */
export function parseAnnouncement(v: unknown[]): Decoded {
  if ((v.length !== 9 && v.length !== 10) || v[0] !== VERSION) return { ok: false, reason: "malformed" };
  const [, sender, seq, sentAt, model, worker, tokens, ttlMs, raw, end] = v;
  if (end !== undefined && end !== 1) return { ok: false, reason: "malformed" };
  if (!isStr(sender) || !isStr(model) || !isStr(worker)) return { ok: false, reason: "malformed" };
  if (!isNum(seq) || !isNum(sentAt) || !isNum(tokens) || !isNum(ttlMs))
    return { ok: false, reason: "malformed" };
  if (!(raw instanceof Uint8Array) || raw.length % 8 !== 0) return { ok: false, reason: "malformed" };
  // Copied: the frame's buffer may be unaligned for a Float64Array view.
  const nodes = new Float64Array(raw.length / 8);
  new Uint8Array(nodes.buffer).set(raw);
  const a: Announcement = { sender, seq, sentAt, model, worker, tokens, ttlMs, nodes };
  if (end === 1) a.end = true;
  return { ok: true, a };
}

export function decodeAnnouncement(frame: Uint8Array, secret: Buffer | null): Decoded {
  const o = openFrame(frame, secret);
  return o.ok ? parseAnnouncement(o.v) : o;
}
