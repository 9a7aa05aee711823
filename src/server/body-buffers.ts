/**
 * Reused memory for large request bodies (issue #17). Every 1 MB body used to get a fresh
 * 1 MB off-heap buffer, moved to the parser worker and back (a new ArrayBuffer object on each
 * side), and freed only when a full GC found it dead: with a few such bodies a second, the
 * external memory they held kept starting mark-compacts of the whole heap, each a pause of
 * tens of milliseconds for every request in flight. Bodies past `POOL_FROM` are read into
 * buffers of a few power-of-two sizes instead, taken from here and given back when the
 * request is done, so a steady stream of large bodies allocates nothing.
 *
 * A buffer is lent to one request at a time: `take` lends, `release` gives back (a second
 * release, or a release of a buffer this pool did not lend, does nothing). A buffer moved to
 * another thread stops being lent under its old object (`handOver`) and is lent again under
 * the object it comes back as (`takeBack`): transferring an ArrayBuffer detaches the sender's
 * object and makes a new one on the receiving side over the same memory.
 *
 * Bounded: at most `MAX_FREE_PER_SIZE` idle buffers of each size and `MAX_FREE_BYTES` in all;
 * past that a released buffer is left to the GC, and sizes above `MAX_POOLED_BYTES` are never
 * kept.
 */

/** Bodies from this many bytes on are read into a pooled buffer (smaller ones: a chunk list). */
export const POOL_FROM = 64 * 1024;
/** Largest buffer kept for reuse (the server's default body limit, 4 MiB). */
export const MAX_POOLED_BYTES = 4 * 1024 * 1024;
const MAX_FREE_PER_SIZE = 4;
const MAX_FREE_BYTES = 8 * 1024 * 1024;

/** Idle buffers by size (a power of two). */
const free = new Map<number, ArrayBuffer[]>();
let freeBytes = 0;
/** Buffers lent and not yet given back, by the object the holder has. */
const lent = new WeakSet<ArrayBuffer>();
let lentCount = 0;
let allocated = 0;

/** The size of buffer lent for `bytes`: the smallest power of two ≥ bytes (and ≥ POOL_FROM). */
export function bufferSizeFor(bytes: number): number {
  let n = POOL_FROM;
  while (n < bytes) n *= 2;
  return n;
}

/** Lends a buffer of at least `bytes` (its size is `bufferSizeFor(bytes)`); its contents are stale. */
export function takeBodyBuffer(bytes: number): ArrayBuffer {
  const size = bufferSizeFor(bytes);
  const idle = free.get(size);
  let buf = idle?.pop();
  if (buf) freeBytes -= size;
  else {
    // Its own allocation (not Node's shared slab), so it can be transferred to a worker whole.
    buf = Buffer.allocUnsafeSlow(size).buffer as ArrayBuffer;
    allocated++;
  }
  lent.add(buf);
  lentCount++;
  return buf;
}

/** Gives back a buffer lent by `takeBodyBuffer` (or `takeBack`); anything else is ignored. */
export function releaseBodyBuffer(buf: ArrayBufferLike): void {
  if (!handOver(buf)) return;
  const size = buf.byteLength;
  if (size > MAX_POOLED_BYTES || freeBytes + size > MAX_FREE_BYTES) return;
  const idle = free.get(size) ?? [];
  if (idle.length >= MAX_FREE_PER_SIZE) return;
  idle.push(buf as ArrayBuffer);
  free.set(size, idle);
  freeBytes += size;
}

/**
 * Ends the lending of `buf` under this object, before it is transferred to another thread.
 * True when it was lent (so its memory is the body's alone and may move whole).
 */
export function handOver(buf: ArrayBufferLike): boolean {
  if (!lent.has(buf as ArrayBuffer)) return false;
  lent.delete(buf as ArrayBuffer);
  lentCount--;
  return true;
}

/** Lends again, under the object it came back as, a buffer handed over to another thread. */
export function takeBack(buf: ArrayBuffer): void {
  if (lent.has(buf)) return;
  lent.add(buf);
  lentCount++;
}

/** Whether `buf` is lent by this pool now (so its holder may write past the body, up to its size). */
export function isLent(buf: ArrayBufferLike): boolean {
  return lent.has(buf as ArrayBuffer);
}

/** For tests and metrics: buffers allocated so far, lent now, and idle bytes kept. */
export function bodyBufferStats(): { allocated: number; lent: number; freeBytes: number } {
  return { allocated, lent: lentCount, freeBytes };
}
