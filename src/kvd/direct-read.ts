/**
 * Reads a socket into buffers the caller chooses, read by read: what `net.Socket`'s `onread`
 * option does for client sockets, which Node 20 offers no way to ask for on a server's
 * accepted sockets. The daemon uses it so that a large PUT's data section is read by the
 * kernel straight into its arena reservation: no 64 KiB Buffer per read and no user-space
 * copy afterwards, the copy that held PUT-over-the-socket well below raw-socket bandwidth.
 *
 * It sets the per-socket fields the `onread` option sets (found by their symbol descriptions)
 * and calls the handle's `useUserBuffer`, so it depends on Node internals. Checked against
 * Node v20.20.2: lib/net.js (the Socket constructor's `onread` handling, initSocketHandle),
 * lib/internal/stream_base_commons.js (onStreamRead: calls kBufferCb(nread, kBuffer), then
 * kBufferGen() and hands its result to C++ as the next read's destination) and
 * src/stream_base.cc (CustomBufferJSListener: libuv reads into that buffer; a non-Uint8Array
 * from kBufferGen keeps the previous one). When any piece is missing it installs nothing and
 * returns false, and the caller keeps the ordinary 'data' path: same bytes, one copy slower.
 *
 * What changes for the socket once installed: no 'data' events and no readable-stream
 * buffering; 'end' (EOF), 'error' and 'close' are still emitted as before.
 */
import type net from "node:net";

export interface BufferReader {
  /** The buffer the next read lands in. Called once at install and after every read. */
  next(): Buffer;
  /** The first `n` bytes of `buf` (the buffer next() last returned) are new. */
  onRead(n: number, buf: Buffer): void;
}

interface UserBufferHandle {
  useUserBuffer?: (buf: Uint8Array) => void;
}

/**
 * From now on every read of `sock` lands in `reader.next()`'s buffer. Call it synchronously in
 * the connection listener, before the loop has read anything. Both callbacks run inside
 * Node's read callback, where an exception would be uncaught and kill the process: one that
 * throws destroys this socket instead.
 */
export function readIntoBuffers(sock: net.Socket, reader: BufferReader): boolean {
  const syms = Object.getOwnPropertySymbols(sock);
  const sym = (d: string) => syms.find((s) => s.description === d);
  const kBuffer = sym("kBuffer");
  const kBufferCb = sym("kBufferCb");
  const kBufferGen = sym("kBufferGen");
  const handle = (sock as unknown as { _handle?: UserBufferHandle | null })._handle;
  if (!kBuffer || !kBufferCb || !kBufferGen || typeof handle?.useUserBuffer !== "function") return false;
  const fields = sock as unknown as Record<symbol, unknown>;
  // Never over a caller's own onread, never on a socket that already read or closed.
  if (fields[kBuffer] || fields[kBufferGen] || fields[kBufferCb] || sock.destroyed || sock.bytesRead > 0)
    return false;
  const first = reader.next();
  if (first.length === 0) return false;
  fields[kBufferGen] = (): Buffer | undefined => {
    try {
      const b = reader.next();
      // An empty buffer would make libuv fail the read with ENOBUFS.
      if (b.length > 0) return b;
      sock.destroy(new Error("kvd read path chose an empty buffer"));
    } catch (e) {
      sock.destroy(e instanceof Error ? e : new Error(String(e)));
    }
    // Not a Uint8Array: Node keeps the previous buffer; the socket is closed anyway.
    return undefined;
  };
  // Returns undefined, never false: false would stop reading until someone resumes it.
  fields[kBufferCb] = (n: number, buf: Buffer): void => {
    try {
      reader.onRead(n, buf);
    } catch (e) {
      sock.destroy(e instanceof Error ? e : new Error(String(e)));
    }
  };
  fields[kBuffer] = first;
  handle.useUserBuffer(first);
  return true;
}
