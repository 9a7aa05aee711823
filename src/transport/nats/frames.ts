/**
 * Wire format of the NATS request plane (one stream per request).
 *
 * Client → agent, on the worker's request subject, reply = the client's per-request inbox:
 *   headers `Infera-Endpoint` (chat|completion), `Infera-Window` (initial credit, in data
 *   frames), plus the request headers the server passes upstream (x-request-id, ...);
 *   payload = the OpenAI JSON body, unchanged.
 *
 * Agent → client, on the inbox, in order (NATS keeps one publisher's order):
 *   - data frames: NO headers, payload = the engine's response bytes as read (zero copies of
 *     ours on this path). Their count is the stream's sequence.
 *   - every other frame has headers, `Infera-Frame` = accept | head | keepalive | end | error,
 *     and `Infera-Seq` = data frames sent before it, so a lost data frame shows as a mismatch.
 *     head adds `Infera-Status` and the engine's response headers; error adds `Infera-Error-Status`,
 *     `Infera-Error-Code` and a message as payload.
 *
 * Client → agent control, on `controlSubject(requestSubject)`, reply = the stream's inbox (the
 * key the agent finds the stream by): 5 bytes, [kind][u32 BE value]:
 *   'C' credit: the agent may send data frames while sent < value (cumulative);
 *   'P' ping: the client is alive (the agent aborts streams whose client went silent);
 *   'A' abort: cancel the engine request now.
 */

export const H_FRAME = "Infera-Frame";
export const H_SEQ = "Infera-Seq";
export const H_STATUS = "Infera-Status";
export const H_ENDPOINT = "Infera-Endpoint";
export const H_WINDOW = "Infera-Window";
export const H_PING_MS = "Infera-Ping-Ms";
export const H_ERROR_STATUS = "Infera-Error-Status";
export const H_ERROR_CODE = "Infera-Error-Code";
/** With code `worker_unreachable`: `connect` or `reset`, as the router's retry path classifies them. */
export const H_ERROR_KIND = "Infera-Error-Kind";

export type FrameKind = "accept" | "head" | "keepalive" | "end" | "error";

export const CTL_CREDIT = 0x43; // 'C'
export const CTL_PING = 0x50; // 'P'
export const CTL_ABORT = 0x41; // 'A'

export function encodeControl(kind: number, value: number): Uint8Array {
  const b = new Uint8Array(5);
  b[0] = kind;
  new DataView(b.buffer).setUint32(1, value >>> 0);
  return b;
}

/** Returns [kind, value], or undefined for a malformed frame (ignored: no input may crash a process). */
export function decodeControl(b: Uint8Array): [number, number] | undefined {
  if (b.length < 5) return undefined;
  return [b[0], new DataView(b.buffer, b.byteOffset, b.byteLength).getUint32(1)];
}

/** Engine response headers worth relaying to the server; hop-by-hop ones are dropped. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "content-length",
  "upgrade",
  "proxy-connection",
  "te",
  "trailer",
]);

export function isRelayedHeader(name: string): boolean {
  return !HOP_BY_HOP.has(name.toLowerCase()) && !name.toLowerCase().startsWith("infera-");
}

/** Default credit window in data frames: enough for ~64 SSE chunks in flight per stream. */
export const DEFAULT_WINDOW = 64;
