/**
 * The read side of a kvd connection, daemon or client: socket bytes in, decoded frames out.
 * Two paths, same frames:
 *
 * - direct (default): the socket reads into a staging buffer, or, while a frame's data
 *   section has a sink destination (the daemon: a PUT's arena reservation; the client: the
 *   caller's buffer of getCopyInto), straight into the unfilled rest of it (direct-read.ts);
 * - 'data' events: Node hands each read over as a fresh Buffer and the decoder copies from
 *   it. Used when the direct path is switched off or Node's internals are not as expected.
 *
 * The counters say which path a connection took and how many bytes went each way, so tests
 * fail if a connection silently fell back.
 */
import type net from "node:net";
import { envVar } from "../config/env-table.ts";
import { readIntoBuffers } from "./direct-read.ts";
import { libc, SO_SNDBUF, SOL_SOCKET } from "./native/libc.ts";
import { type Frame, type FrameDecoder, ProtocolError } from "./protocol.ts";

export interface SocketReadStats {
  /** Connections reading through the direct path. */
  directConnections: number;
  /** Connections on the ordinary 'data' path (switched off, or Node internals absent). */
  dataEventConnections: number;
  /** Bytes the kernel read straight into sink destinations. */
  intoSinkBytes: number;
  /** Bytes read into a staging or Node-allocated buffer, then copied by the decoder. */
  copiedBytes: number;
}

export function newSocketReadStats(): SocketReadStats {
  return { directConnections: 0, dataEventConnections: 0, intoSinkBytes: 0, copiedBytes: 0 };
}

/** What libuv reads per call on the ordinary path. */
const STAGING_BYTES = 64 * 1024;
/**
 * One staging buffer for every connection of the process. Safe because each read is consumed
 * before the next can happen: libuv calls back right after read(2), FrameDecoder.push copies
 * whatever it keeps before it returns, and there is one JS thread.
 */
let staging: Buffer | null = null;

export interface FrameSource {
  decoder: FrameDecoder;
  stats: SocketReadStats;
  /** Try the direct path (false: always the 'data' path). */
  direct: boolean;
  closed: () => boolean;
  onFrames: (frames: Frame[]) => void;
  /** A framing violation: the connection must be closed. `err` is the decoder's, when it threw one. */
  onViolation: (why: string, err?: ProtocolError) => void;
}

/**
 * Starts reading `sock`; returns the path taken. Call it before the event loop has had a
 * chance to read from the socket (the direct path refuses a socket that already read).
 */
export function readFrames(sock: net.Socket, src: FrameSource): "direct" | "data" {
  const { decoder, stats } = src;
  const deliver = (decode: () => Frame[]) => {
    let frames: Frame[];
    try {
      frames = decode();
    } catch (e) {
      if (e instanceof ProtocolError) {
        if (e.framesBefore) src.onFrames(e.framesBefore);
        src.onViolation(e.message, e);
      } else src.onViolation("undecodable frame");
      return;
    }
    src.onFrames(frames);
  };
  const feed = (chunk: Buffer) => {
    if (src.closed()) return;
    stats.copiedBytes += chunk.length;
    deliver(() => decoder.push(chunk));
  };
  staging ??= Buffer.allocUnsafe(STAGING_BYTES);
  const stage = staging;
  const direct =
    src.direct &&
    readIntoBuffers(sock, {
      next: () => (src.closed() ? null : decoder.sinkRemainder()) ?? stage,
      onRead: (n, buf) => {
        if (src.closed()) return;
        if (buf === stage) feed(stage.subarray(0, n));
        else {
          stats.intoSinkBytes += n;
          deliver(() => decoder.advanceSink(n));
        }
      },
    });
  if (direct) stats.directConnections++;
  else {
    stats.dataEventConnections++;
    sock.on("data", feed);
  }
  return direct ? "direct" : "data";
}

/**
 * The send buffer kvd asks for on its Unix sockets, daemon and Node client (INFERA_KVD_SNDBUF
 * overrides, 0 leaves the OS default). On a Unix stream socket the sender's SO_SNDBUF bounds
 * the bytes in flight (the receiver's SO_RCVBUF plays no part), so with the usual 208 KiB
 * default a 1 MiB chunk crosses in ~6 partial writes and ~6 reads, each a wake-up of the other
 * side and, on the read side, a JS callback; with a few MiB it is one write and one or two
 * reads. The kernel caps the request at net.core.wmem_max (208 KiB unless raised), so on a
 * stock kernel this changes nothing.
 */
export const SEND_BUFFER_BYTES = Number(envVar("INFERA_KVD_SNDBUF") ?? 4 * 1024 * 1024);

/**
 * Asks for a `bytes` send buffer on a Unix socket; returns what the kernel granted (it
 * doubles the request, capped by net.core.wmem_max), or -1 where it could not be set.
 * Never throws: the socket works either way.
 */
export function widenSendBuffer(sock: net.Socket, bytes = SEND_BUFFER_BYTES): number {
  if (!(bytes > 0) || process.platform !== "linux") return -1;
  const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== "number" || fd < 0) return -1;
  try {
    const c = libc();
    const v = Buffer.alloc(4);
    v.writeInt32LE(Math.min(bytes, 0x3fffffff));
    if (c.setsockopt(fd, SOL_SOCKET, SO_SNDBUF, v, 4) !== 0) return -1;
    const len = [4];
    return c.getsockopt(fd, SOL_SOCKET, SO_SNDBUF, v, len) === 0 ? v.readInt32LE(0) : -1;
  } catch {
    return -1;
  }
}
