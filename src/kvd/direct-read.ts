/**
 * Reads a socket into buffers the caller chooses, read by read (what `net.Socket`'s `onread`
 * option does for client sockets; Node 20 offers no way to pass it to a server's accepted
 * sockets). The daemon uses it so a large PUT's data section is read by the kernel straight
 * into its arena reservation: no 64 KiB Buffer per read and no user-space copy afterwards,
 * which is the one copy that held PUT-sock below the raw-socket baseline.
 *
 * It sets the same per-socket fields `onread` sets (found by their symbol descriptions), so it
 * depends on Node internals: when they are not there it returns false and the caller keeps
 * the ordinary 'data' path, which behaves identically, one copy slower.
 */
import type net from "node:net";

interface UserBufferHandle {
  useUserBuffer?: (buf: Uint8Array) => void;
}

/**
 * From now on every read of `sock` lands in the buffer `next()` returns (called once now and
 * again after each read), and `onRead(n, buf)` receives it: the first `n` bytes of `buf` are
 * new. No 'data' events are emitted afterwards; 'end', 'error' and 'close' are unchanged.
 * Call it synchronously in the connection listener, before any byte has been read.
 */
export function readIntoBuffers(
  sock: net.Socket,
  next: () => Buffer,
  onRead: (n: number, buf: Buffer) => void,
): boolean {
  const syms = Object.getOwnPropertySymbols(sock);
  const sym = (d: string) => syms.find((s) => s.description === d);
  const kBuffer = sym("kBuffer");
  const kBufferCb = sym("kBufferCb");
  const kBufferGen = sym("kBufferGen");
  const handle = (sock as unknown as { _handle?: UserBufferHandle | null })._handle;
  if (!kBuffer || !kBufferCb || !kBufferGen || typeof handle?.useUserBuffer !== "function") return false;
  const fields = sock as unknown as Record<symbol, unknown>;
  // Never installed twice, nor over a caller's own onread.
  if (fields[kBuffer] || fields[kBufferGen]) return false;
  const first = next();
  fields[kBufferGen] = next;
  fields[kBufferCb] = (n: number, buf: Buffer) => {
    onRead(n, buf);
  };
  fields[kBuffer] = first;
  handle.useUserBuffer(first);
  return true;
}
