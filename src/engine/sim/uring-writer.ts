import type { Socket } from "node:net";
import koffi from "koffi";
import { isMapFailed, libc, viewOf } from "../../kvd/native/libc.ts";

/**
 * Sends a tick's SSE events for all streams in ONE system call (io_uring, one SEND per
 * socket), instead of one `socket.write` each. Under 64 streams the sim writes ~13 k small
 * events a second; the kernel's TCP work per event stays, but Node's write path (a WriteWrap,
 * stream state, an after-write callback per event: 0.6–1.5 µs of user CPU per event measured)
 * goes, which is most of what separated the sim from its CPU budget per token.
 *
 * Safety, since these bytes bypass Node's stream:
 * - a socket takes this path only while Node has nothing queued for it, and the batch is sent
 *   and completed within the same synchronous call (min_complete = every SEND), so bytes never
 *   pass each other and the fd cannot be closed (or reused) under the ring;
 * - SENDs carry MSG_DONTWAIT: a full socket answers -EAGAIN at once instead of blocking, and
 *   what was not sent (all or the tail) then goes through `socket.write`, after which the
 *   socket stays on Node's path until its queue drains;
 * - a connection error destroys that socket (its 'close' aborts the request, as a failed
 *   Node write does); an error of the operation itself (a kernel or sandbox refusing it) sends
 *   the bytes through Node and turns the writer off; a failed io_uring_enter sends the whole batch through Node and turns the
 *   writer off.
 * Linux ≥ 5.12 only; where io_uring is unavailable (an older kernel, a seccomp profile that
 * blocks it, as Docker's default does) `create` returns null and the sim writes through Node.
 */
export class UringWriter {
  private readonly sqe: Uint32Array;
  private readonly sq: Buffer;
  private readonly cq: Buffer;
  private readonly arena: Buffer;
  private readonly arenaLo: number;
  private readonly arenaHi: number;
  /** Queued this batch: the socket, and where its bytes lie in the arena. */
  private readonly socks: Socket[] = [];
  private readonly offs: number[] = [];
  private readonly lens: number[] = [];
  private used = 0;
  private disabled = false;
  private closed = false;
  /** Counters for /metrics-free diagnosis in tests and benches. */
  readonly stats = { batches: 0, sends: 0, fallbacks: 0, partial: 0 };

  private constructor(
    private readonly ringFd: number,
    private readonly entries: number,
    private readonly off: {
      sqTail: number;
      sqMask: number;
      cqHead: number;
      cqTail: number;
      cqMask: number;
      cqes: number;
    },
    rings: { sq: Buffer; cq: Buffer; sqes: Buffer; arena: Buffer; arenaAddr: bigint },
  ) {
    this.sq = rings.sq;
    this.cq = rings.cq;
    this.sqe = new Uint32Array(rings.sqes.buffer, rings.sqes.byteOffset, rings.sqes.length / 4);
    this.arena = rings.arena;
    this.arenaLo = Number(rings.arenaAddr & 0xffffffffn);
    this.arenaHi = Number(rings.arenaAddr >> 32n);
  }

  /** Sets up a ring of `entries` SENDs and an `arenaBytes` staging buffer; null where io_uring is unavailable. */
  static create(entries = 256, arenaBytes = 1 << 20): UringWriter | null {
    if (process.platform !== "linux") return null;
    try {
      const c = libc();
      const params = Buffer.alloc(120); // struct io_uring_params
      const fd = Number(c.syscallPtr(SYS_IO_URING_SETUP, entries, params));
      if (fd < 0) return null;
      const u32 = (o: number): number => params.readUInt32LE(o);
      const sqEntries = u32(0);
      const cqEntries = u32(4);
      const features = u32(20);
      // sq_off at 40: head, tail, ring_mask, ring_entries, flags, dropped, array; cq_off at 80:
      // head, tail, ring_mask, ring_entries, overflow, cqes.
      const off = {
        sqTail: u32(44),
        sqMask: u32(48),
        cqHead: u32(80),
        cqTail: u32(84),
        cqMask: u32(88),
        cqes: u32(100),
      };
      const sqArray = u32(64);
      const sqSize = sqArray + sqEntries * 4;
      const cqSize = off.cqes + cqEntries * 16;
      // Kernels before 5.12 lack these features and may punt a send that would block to a
      // worker instead of answering -EAGAIN (stalling the loop on a slow client): Node writes there.
      if ((features & REQUIRED_FEATURES) !== REQUIRED_FEATURES) {
        c.close(fd);
        return null;
      }
      const single = (features & IORING_FEAT_SINGLE_MMAP) !== 0;
      const map = (len: number, offset: number): Buffer | null => {
        const p = c.mmap(null, len, PROT_RW, MAP_SHARED | MAP_POPULATE, fd, offset);
        return isMapFailed(p) ? null : viewOf(p, len);
      };
      const sq = map(single ? Math.max(sqSize, cqSize) : sqSize, IORING_OFF_SQ_RING);
      const cq = single ? sq : map(cqSize, IORING_OFF_CQ_RING);
      const sqes = map(sqEntries * 64, IORING_OFF_SQES);
      const arenaPtr = c.mmap(null, arenaBytes, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (!sq || !cq || !sqes || isMapFailed(arenaPtr)) {
        c.close(fd);
        return null;
      }
      // The SQ index array maps slot i to SQE i, once: SQEs are used in ring order.
      for (let i = 0; i < sqEntries; i++) sq.writeUInt32LE(i, sqArray + i * 4);
      const arenaAddr = koffi.address(arenaPtr) as bigint;
      return new UringWriter(fd, sqEntries, off, {
        sq,
        cq,
        sqes,
        arena: viewOf(arenaPtr, arenaBytes),
        arenaAddr,
      });
    } catch {
      return null;
    }
  }

  get enabled(): boolean {
    return !this.disabled;
  }

  /**
   * Queues `chunk` (already HTTP-framed) for `sock` in this batch. False when it cannot take
   * it (writer off, Node has bytes queued for the socket, no fd, batch full): the caller then
   * writes through Node, which keeps the order.
   */
  add(sock: Socket, chunk: string, ascii: boolean): boolean {
    if (this.disabled || sock.writableLength > 0 || sock.destroyed) return false;
    const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
    if (typeof fd !== "number" || fd < 0) return false;
    if (this.socks.length === this.entries) this.flush();
    const len = ascii ? chunk.length : Buffer.byteLength(chunk);
    if (this.used + len > this.arena.length) {
      this.flush();
      if (len > this.arena.length) return false;
    }
    const at = this.used;
    this.arena.write(chunk, at, ascii ? "latin1" : "utf8");
    this.used += len;
    const tail = this.sq.readUInt32LE(this.off.sqTail);
    const mask = this.sq.readUInt32LE(this.off.sqMask);
    const w = ((tail + this.socks.length) & mask) * 16;
    const s = this.sqe;
    s[w] = IORING_OP_SEND; // opcode, flags 0, ioprio 0
    s[w + 1] = fd;
    s[w + 2] = 0; // off
    s[w + 3] = 0;
    const lo = this.arenaLo + at;
    s[w + 4] = lo >>> 0; // addr
    s[w + 5] = this.arenaHi + (lo > 0xffffffff ? 1 : 0);
    s[w + 6] = len;
    s[w + 7] = MSG_DONTWAIT | MSG_NOSIGNAL;
    s[w + 8] = this.socks.length; // user_data: index in this batch
    for (let q = 9; q < 16; q++) s[w + q] = 0;
    this.socks.push(sock);
    this.offs.push(at);
    this.lens.push(len);
    return true;
  }

  /** Sends the batch in one io_uring_enter and settles every SEND before returning. */
  flush(): void {
    const n = this.socks.length;
    if (n === 0) return;
    const c = libc();
    const tail = this.sq.readUInt32LE(this.off.sqTail);
    this.sq.writeUInt32LE((tail + n) >>> 0, this.off.sqTail);
    this.stats.batches++;
    const done = new Int32Array(n).fill(NOT_SENT);
    let submitted = 0;
    let reaped = 0;
    // Normally one call submits and completes everything; a signal (EINTR) only means "call again".
    for (let tries = 0; reaped < n && tries < 100; tries++) {
      const r = Number(
        c.syscall6(SYS_IO_URING_ENTER, this.ringFd, n - submitted, n - reaped, IORING_ENTER_GETEVENTS, 0, 0),
      );
      if (r < 0) {
        if (c.errno() === EINTR) continue;
        this.disabled = true; // the ring itself failed: Node's path from now on
        break;
      }
      submitted += r;
      reaped += this.reap(done, n);
    }
    for (let i = 0; i < n; i++) {
      // Submitted but never completed (a broken ring): its bytes may or may not have gone out,
      // so the stream cannot continue intact.
      const res = done[i] === NOT_SENT && i < submitted ? LOST : done[i];
      this.settle(this.socks[i], this.offs[i], this.lens[i], res);
    }
    this.socks.length = 0;
    this.offs.length = 0;
    this.lens.length = 0;
    this.used = 0;
  }

  /** Takes the completions off the ring into `done` (indexed by user_data); returns how many. */
  private reap(done: Int32Array, n: number): number {
    const cq = this.cq;
    const mask = cq.readUInt32LE(this.off.cqMask);
    let head = cq.readUInt32LE(this.off.cqHead);
    const end = cq.readUInt32LE(this.off.cqTail);
    let count = 0;
    for (; head !== end; head = (head + 1) >>> 0) {
      const at = this.off.cqes + (head & mask) * 16;
      const i = cq.readUInt32LE(at);
      if (i < n) done[i] = cq.readInt32LE(at + 8);
      count++;
    }
    cq.writeUInt32LE(head, this.off.cqHead);
    return count;
  }

  private settle(sock: Socket, at: number, len: number, res: number): void {
    if (res === len) {
      this.stats.sends++;
      return;
    }
    if (res >= 0 || res === -EAGAIN || res === NOT_SENT) {
      // Not (all) sent: the rest through Node, which queues it in order.
      const sent = Math.max(res, 0);
      if (sent > 0) this.stats.partial++;
      else this.stats.fallbacks++;
      if (!sock.destroyed) sock.write(Buffer.from(this.arena.subarray(at + sent, at + len)));
      return;
    }
    this.stats.fallbacks++;
    if (res !== LOST && !CONNECTION_ERRNOS.has(-res)) {
      // The ring refused the operation itself (EINVAL, EOPNOTSUPP, EBADF...: a kernel or
      // sandbox that does not allow it): nothing was sent, so Node sends it, and all later ones.
      this.disabled = true;
      if (!sock.destroyed) sock.write(Buffer.from(this.arena.subarray(at, at + len)));
      return;
    }
    // The connection broke (EPIPE, ECONNRESET, ...) or the ring lost the send: close it as a
    // failed Node write would (its 'close' aborts the request), without an 'error' to handle.
    sock.destroy();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.disabled = true;
    libc().close(this.ringFd);
  }
}

let shared: UringWriter | null | undefined;

/** The process's writer (one ring serves every sim in the process), or null where io_uring is unavailable. */
export function sharedUringWriter(): UringWriter | null {
  if (shared === undefined) shared = UringWriter.create();
  return shared;
}

/** Sends what the shared writer has queued, if it exists. */
export function flushSharedUringWriter(): void {
  shared?.flush();
}

// Same numbers on x86-64 and aarch64 (syscalls added after 5.0 are numbered alike).
const SYS_IO_URING_SETUP = 425;
const SYS_IO_URING_ENTER = 426;
const IORING_FEAT_SINGLE_MMAP = 1;
const IORING_FEAT_FAST_POLL = 1 << 5; // 5.7
const IORING_FEAT_NATIVE_WORKERS = 1 << 9; // 5.12
const REQUIRED_FEATURES = IORING_FEAT_FAST_POLL | IORING_FEAT_NATIVE_WORKERS;
const IORING_OFF_SQ_RING = 0;
const IORING_OFF_CQ_RING = 0x8000000;
const IORING_OFF_SQES = 0x10000000;
const IORING_ENTER_GETEVENTS = 1;
const IORING_OP_SEND = 26;
const MSG_DONTWAIT = 0x40;
const MSG_NOSIGNAL = 0x4000;
const EAGAIN = 11;
const PROT_RW = 0x3;
const MAP_SHARED = 0x01;
const MAP_PRIVATE = 0x02;
const MAP_ANONYMOUS = 0x20;
const MAP_POPULATE = 0x8000;
const EINTR = 4;
/** EPIPE, ENETUNREACH, ECONNABORTED, ECONNRESET, ENOTCONN, ETIMEDOUT, EHOSTUNREACH. */
const CONNECTION_ERRNOS = new Set([32, 101, 103, 104, 107, 110, 113]);
/** A SEND the kernel never took: its bytes go through Node. */
const NOT_SENT = -0x7fffffff;
/** A SEND taken but never completed: the socket is destroyed. */
const LOST = -0x7ffffffe;
