/**
 * A ZMQ SUB socket read straight through libzmq's C API (koffi FFI), many messages per wake-up.
 *
 * Why: zeromq.js' `receive()` costs ≈ 5 µs of CPU per message on this box (one promise, an N-API
 * round trip, a Buffer per frame and, for frames over 128 bytes, an external buffer whose
 * finalizer runs at GC), which alone caps one core below 200k messages/s. Here a message costs
 * six plain FFI calls (`zmq_recv` and `zmq_getsockopt(ZMQ_RCVMORE)` per frame) into buffers
 * allocated once, and the socket is drained until EAGAIN on every wake-up
 * (bench/kv-ingest/RESULTS.md has the figures).
 *
 * The library is the libzmq zeromq.js already loaded (its addon exports the C API), found in
 * /proc/self/maps, so there is no second libzmq. Sockets live in a context of their own.
 *
 * Wake-ups: libzmq gives each socket a file descriptor (ZMQ_FD) that turns readable when the
 * socket's state may have changed; the owning thread then drains it (libzmq include/zmq.h and
 * doc/zmq_getsockopt.adoc "ZMQ_FD" @ 00e514e2c9b8ae0373a2b9d0e594310efd152fe5). Node has no
 * public way to watch an arbitrary fd, so one worker thread waits in edge-triggered epoll on
 * every registered fd (never touching the sockets themselves, which are not thread safe) and
 * tells the main thread which were signalled; the main thread drains each until EAGAIN
 * (./fd-watcher.ts).
 *
 * Linux only; `loadNativeZmq()` returns null elsewhere or when anything is missing, and the
 * caller falls back to zeromq.js.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import koffi from "koffi";
import "zeromq";

// libzmq include/zmq.h @ 00e514e2c9b8ae0373a2b9d0e594310efd152fe5.
const ZMQ_PAIR = 0;
const ZMQ_SUB = 2;
const ZMQ_MAX_SOCKETS = 2;
const ZMQ_SOCKET_LIMIT = 3;
const ZMQ_SUBSCRIBE = 6;
const ZMQ_RCVMORE = 13;
const ZMQ_FD = 14;
const ZMQ_LINGER = 17;
const ZMQ_DONTWAIT = 1;
const ZMQ_EVENT_DISCONNECTED = 0x0200;
const EINTR = 4;

/** Frames above this are refused (the message counts as malformed): far above any KV batch. */
export const NATIVE_FRAME_CAP = 16 * 1024 * 1024;
/** Frames read per message at most; the rest of a longer message is read and dropped. */
const MAX_FRAMES = 4;

type Ptr = object;
type Fn<A extends unknown[], R> = (...args: A) => R;

interface ZmqApi {
  ctx: Ptr;
  socket: Fn<[Ptr, number], Ptr | null>;
  close: Fn<[Ptr], number>;
  setsockopt: Fn<[Ptr, number, Uint8Array, number], number>;
  getsockopt: Fn<[Ptr, number, Uint8Array, Uint8Array], number>;
  connect: Fn<[Ptr, string], number>;
  recv: Fn<[Ptr, Uint8Array, number, number], number>;
  monitor: Fn<[Ptr, string, number], number>;
  errno: Fn<[], number>;
  strerror: Fn<[number], string>;
  koffiPath: string;
}

let api: ZmqApi | null | undefined;

/** libzmq's C API through koffi, or null when it cannot be had (not Linux, no koffi, …). */
export function loadNativeZmq(): ZmqApi | null {
  if (api !== undefined) return api;
  api = null;
  if (process.platform !== "linux" || process.env.INFERA_KV_ZMQ_NATIVE === "0") return api;
  try {
    const require = createRequire(import.meta.url);
    const koffiPath = require.resolve("koffi");
    const addon = readFileSync("/proc/self/maps", "utf8")
      .split("\n")
      .map((l) => l.split(/\s+/).pop() ?? "")
      .find((p) => /zeromq.*addon\.node$/.test(p));
    if (!addon) return api;
    const lib = koffi.load(addon);
    const ctxNew = lib.func("void *zmq_ctx_new()") as Fn<[], Ptr>;
    const ctxGet = lib.func("int zmq_ctx_get(void *, int)") as Fn<[Ptr, number], number>;
    const ctxSet = lib.func("int zmq_ctx_set(void *, int, int)") as Fn<[Ptr, number, number], number>;
    const ctx = ctxNew();
    // As src/util/zmq-limits.ts does for zeromq.js' context: the fd limit bounds sockets, not 1023.
    ctxSet(ctx, ZMQ_MAX_SOCKETS, ctxGet(ctx, ZMQ_SOCKET_LIMIT));
    api = {
      ctx,
      koffiPath,
      socket: lib.func("void *zmq_socket(void *, int)"),
      close: lib.func("int zmq_close(void *)"),
      setsockopt: lib.func("int zmq_setsockopt(void *, int, const void *, size_t)"),
      // Plain pointers to Buffers: koffi passes them as they are. With _Out_/_Inout_ and a JS
      // array for the length it marshals both ways, ≈ 5× the cost of the call.
      getsockopt: lib.func("int zmq_getsockopt(void *, int, void *, void *)"),
      connect: lib.func("int zmq_connect(void *, const char *)"),
      recv: lib.func("int zmq_recv(void *, void *, size_t, int)"),
      monitor: lib.func("int zmq_socket_monitor(void *, const char *, int)"),
      errno: lib.func("int zmq_errno()"),
      strerror: lib.func("const char *zmq_strerror(int)"),
    };
  } catch {
    api = null;
  }
  return api;
}

/** Frames of the last message read; views of buffers reused by the next read (copy to keep). */
export interface NativeFrames {
  /** How many frames the message had (views beyond MAX_FRAMES are not kept). */
  count: number;
  /** One view per frame, `count` of them (at most MAX_FRAMES); valid until the next read. */
  views: Uint8Array[];
  /** A frame was over NATIVE_FRAME_CAP (its view is truncated). */
  truncated: boolean;
}

// One set of receive buffers for the whole process: messages are handled synchronously, one at
// a time, so no two reads overlap. Big buffers are allocated lazily by the OS (untouched pages).
// Made with the first socket: a process that never reads natively (the sim, the CLI) pays nothing.
let scratch: Buffer[] = [];
const lastFrames: NativeFrames = { count: 0, views: [], truncated: false };
// The last view made of each scratch buffer: a topic or a seq frame has the same length every
// time, so its view is made once, not per message (less garbage at 200k messages/s).
let views: Uint8Array[] = [];

function allocScratch(): void {
  if (scratch.length > 0) return;
  scratch = Array.from({ length: MAX_FRAMES }, () => Buffer.allocUnsafeSlow(NATIVE_FRAME_CAP));
  views = scratch.map((b) => b.subarray(0, 0));
}

function view(i: number, n: number): Uint8Array {
  const len = Math.min(n, NATIVE_FRAME_CAP);
  let v = views[i];
  if (v.length !== len) {
    v = scratch[i].subarray(0, len);
    views[i] = v;
  }
  return v;
}
// An aligned int for options, read through the typed array (no Buffer method per frame).
const intVal = new Int32Array(2);
const intBuf = Buffer.from(intVal.buffer);
/**
 * A `size_t` holding 4: getsockopt writes the option's size back, and every option read here
 * (ZMQ_FD, ZMQ_RCVMORE) is a 4-byte int, so it stays 4 and is set once.
 */
const intLen = Buffer.alloc(8);
intLen.writeUInt32LE(4, 0);

function check(z: ZmqApi, rc: number, what: string): void {
  if (rc < 0) throw new Error(`${what}: ${z.strerror(z.errno())}`);
}

/**
 * Runs a libzmq call again while it fails with EINTR (a signal — the profiler's SIGPROF under
 * `--cpu-prof`, a child's SIGCHLD — arrived while it waited), then checks it. Safe for connect:
 * its EINTR comes from `process_commands`, before anything is parsed or attached (zeromq/libzmq
 * src/socket_base.cpp `connect_internal` @ 45501798a230d862c3e0f3fa77324452a56c1d5f); a 1,000-
 * worker server under `--cpu-prof` lost a subscriber to `connect …: Interrupted system call`.
 */
function retrying(z: ZmqApi, call: () => number, what: string): void {
  let rc = call();
  for (let tries = 0; rc < 0 && z.errno() === EINTR && tries < 100; tries++) rc = call();
  check(z, rc, what);
}

let monitorSeq = 0;

export class NativeSub {
  private readonly z: ZmqApi;
  private sock: Ptr | null;
  private mon: Ptr | null = null;
  /** The socket's ZMQ_FD (and the monitor's), for the watcher. */
  readonly fd: number;
  readonly monitorFd: number;

  constructor(z: ZmqApi, endpoint: string, topic: string) {
    this.z = z;
    allocScratch();
    const s = z.socket(z.ctx, ZMQ_SUB);
    if (!s) throw new Error(`zmq_socket: ${z.strerror(z.errno())}`);
    this.sock = s;
    intBuf.writeInt32LE(0, 0);
    check(z, z.setsockopt(s, ZMQ_LINGER, intBuf, 4), "ZMQ_LINGER");
    const t = Buffer.from(topic, "utf8");
    check(z, z.setsockopt(s, ZMQ_SUBSCRIBE, t, t.length), "ZMQ_SUBSCRIBE");
    // The PUB side dropping its connection is how a restarted engine can look from here.
    const inproc = `inproc://infera-kv-mon-${process.pid}-${monitorSeq++}`;
    retrying(z, () => z.monitor(s, inproc, ZMQ_EVENT_DISCONNECTED), "zmq_socket_monitor");
    const m = z.socket(z.ctx, ZMQ_PAIR);
    if (!m) throw new Error(`zmq_socket: ${z.strerror(z.errno())}`);
    this.mon = m;
    check(z, z.setsockopt(m, ZMQ_LINGER, intBuf, 4), "ZMQ_LINGER");
    retrying(z, () => z.connect(m, inproc), "monitor connect");
    retrying(z, () => z.connect(s, endpoint), `connect ${endpoint}`);
    this.fd = this.fdOf(s);
    this.monitorFd = this.fdOf(m);
    // A ZMQ_FD signals new messages only once a read has found the socket empty (libzmq's ypipe
    // wakes a reader it knows to be asleep), so both sockets are read once now.
    this.disconnected();
    this.read();
  }

  private fdOf(s: Ptr): number {
    check(this.z, this.z.getsockopt(s, ZMQ_FD, intBuf, intLen), "ZMQ_FD");
    return intBuf.readInt32LE(0);
  }

  /** Reads one message without waiting; null when none is queued (or the socket is closed). */
  read(): NativeFrames | null {
    const s = this.sock;
    return s ? readMessage(this.z, s) : null;
  }

  /** Reads every queued monitor event; true when any says the connection dropped. */
  disconnected(): boolean {
    const m = this.mon;
    let seen = false;
    // The monitor sends [event id (u16) + value (u32), endpoint] per event; only
    // ZMQ_EVENT_DISCONNECTED is asked for.
    while (m && readMessage(this.z, m)) seen = true;
    return seen;
  }

  close(): void {
    if (this.mon) this.z.close(this.mon);
    if (this.sock) this.z.close(this.sock);
    this.mon = null;
    this.sock = null;
  }
}

function readMessage(z: ZmqApi, s: Ptr): NativeFrames | null {
  let n = z.recv(s, scratch[0], NATIVE_FRAME_CAP, ZMQ_DONTWAIT);
  while (n < 0) {
    if (z.errno() !== EINTR) return null; // EAGAIN: nothing queued
    n = z.recv(s, scratch[0], NATIVE_FRAME_CAP, ZMQ_DONTWAIT);
  }
  const f = lastFrames;
  f.truncated = n > NATIVE_FRAME_CAP;
  f.views.length = 0;
  f.views.push(view(0, n));
  let count = 1;
  for (;;) {
    z.getsockopt(s, ZMQ_RCVMORE, intBuf, intLen);
    if (intVal[0] === 0) break;
    const i = Math.min(count, MAX_FRAMES - 1);
    // The rest of a message is already queued whole (ZMQ delivers messages atomically).
    n = z.recv(s, scratch[i], NATIVE_FRAME_CAP, ZMQ_DONTWAIT);
    while (n < 0 && z.errno() === EINTR) n = z.recv(s, scratch[i], NATIVE_FRAME_CAP, ZMQ_DONTWAIT);
    if (n < 0) break;
    if (n > NATIVE_FRAME_CAP) f.truncated = true;
    if (count < MAX_FRAMES) f.views.push(view(i, n));
    count++;
  }
  f.count = count;
  return f;
}
