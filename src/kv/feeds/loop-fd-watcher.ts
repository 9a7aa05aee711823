/**
 * The fd watcher on the main thread's own event loop: one edge-triggered epoll set holds every
 * watched fd, and libuv watches that one epoll fd (`uv_poll_t`, through koffi) like any socket.
 * When it turns readable the main thread takes the ready fds with a non-blocking `epoll_wait`
 * and calls their drains — in a `setImmediate` of the same loop turn, so a drain runs inside
 * Node's own callback scope (its promises settle, its errors reach the process as usual).
 *
 * Why, over ./fd-watcher.ts's thread: with KV events spread over a fleet, each message arrives
 * alone, and the thread cost a wake-up of its own (epoll, `postMessage`, back to sleep) beside
 * the main thread's wake-up for the message. Here the main thread is woken once, and not at all
 * when it is awake anyway (serving a request), since libuv collects the epoll fd with its other
 * sockets. Measured at 256 workers, 1,000 req/s: kv-aware 2–9 % less server CPU per request,
 * its other threads 2.4–3.8 points of a core lower; following KV events alone, 18–25 % less
 * (bench/fleet-scale/RESULTS.md, 2026-12-05 12:00, "The fd watcher on the main thread's own
 * loop").
 *
 * Edge-triggered, as the thread's (see the rules there): an add reports an fd already readable,
 * and each drain reads its socket until EAGAIN, so every later arrival is an epoll event again.
 * libuv's own watch of the epoll fd is level-triggered: readable while any event is queued in
 * the set, so an event left there (an interrupted `epoll_wait`, more ready fds than one read
 * takes) is reported again on the next loop turn.
 *
 * Needs libuv's `uv_default_loop`, `uv_poll_init`, `uv_poll_start` and `uv_unref` in the
 * process (Node exports them for addons) and the main thread (the default loop is the main
 * thread's); `LoopFdWatcher.create` returns null otherwise and the caller uses the thread.
 */
import { isMainThread } from "node:worker_threads";
import koffi from "koffi";

type Fn<A extends unknown[], R> = (...args: A) => R;
type Ptr = object;
type Drain = () => void;

/** What must outlive every call: the uv_poll_t libuv writes to, the callback it calls. */
const retained: unknown[] = [];

// sys/epoll.h; struct epoll_event is packed on x86-64 (12 bytes, data at 4), 16 bytes elsewhere
// (linux include/uapi/linux/eventpoll.h, EPOLL_PACKED).
const EPOLL_CLOEXEC = 0o2000000;
const EPOLL_CTL_ADD = 1;
const EPOLL_CTL_DEL = 2;
const EPOLL_CTL_MOD = 3;
const EPOLLIN_ET = (1 | 0x80000000) >>> 0;
const SIZE = process.arch === "x64" ? 12 : 16;
const DATA = process.arch === "x64" ? 4 : 8;
/** Ready fds taken per `epoll_wait`; more stay queued and are taken in the same turn. */
const MAX = 1024;
/** libuv include/uv.h `UV_READABLE`. */
const UV_READABLE = 1;
/**
 * Room for a `uv_poll_t`: 160 bytes on 64-bit Linux with libuv 1.x (`UV_HANDLE_FIELDS`,
 * `poll_cb`, `uv__io_t`); kept generous, zeroed, and alive for the process's life.
 */
const UV_POLL_BYTES = 1024;

interface LoopApi {
  epollCtl: Fn<[number, number, number, Uint8Array], number>;
  epollWait: Fn<[number, Uint8Array, number, number], number>;
  ep: number;
}

export class LoopFdWatcher {
  private readonly api: LoopApi;
  private readonly drains = new Map<number, Drain>();
  private readonly events = Buffer.alloc(SIZE * MAX);
  private readonly one = Buffer.alloc(SIZE);
  private scheduled = false;

  /** The watcher on the main thread's loop, or null where that cannot be had. */
  static create(): LoopFdWatcher | null {
    if (!isMainThread || process.platform !== "linux" || process.env.INFERA_KV_FD_WATCHER === "thread")
      return null;
    try {
      const self = koffi.load(null);
      const libc = koffi.load("libc.so.6");
      const uvDefaultLoop = self.func("void *uv_default_loop()") as Fn<[], Ptr>;
      const uvPollInit = self.func("int uv_poll_init(void *, void *, int)") as Fn<
        [Ptr, Uint8Array, number],
        number
      >;
      const cbType = koffi.pointer(koffi.proto("void infera_uv_poll_cb(void *, int, int)"));
      const uvPollStart = self.func("int uv_poll_start(void *, int, infera_uv_poll_cb *)") as Fn<
        [Uint8Array, number, unknown],
        number
      >;
      const uvUnref = self.func("void uv_unref(void *)") as Fn<[Uint8Array], void>;
      const epollCreate = libc.func("int epoll_create1(int)") as Fn<[number], number>;
      const api: LoopApi = {
        epollCtl: libc.func("int epoll_ctl(int, int, int, void *)"),
        epollWait: libc.func("int epoll_wait(int, void *, int, int)"),
        ep: epollCreate(EPOLL_CLOEXEC),
      };
      if (api.ep < 0) return null;
      // Its own off-heap store (never pooled, past V8's 64-byte on-heap limit): the address
      // libuv keeps in its handle queue never moves.
      const handle = Buffer.allocUnsafeSlow(UV_POLL_BYTES).fill(0);
      if (uvPollInit(uvDefaultLoop(), handle, api.ep) !== 0) return null;
      // In the loop's handle queue from here on, started or not: never freed.
      retained.push(handle);
      let w: LoopFdWatcher | null = null;
      const cb = koffi.register(() => w?.onReadable(), cbType);
      if (uvPollStart(handle, UV_READABLE, cb) !== 0) return null;
      // Like the thread's `unref`: watching KV sockets never keeps the process alive.
      uvUnref(handle);
      retained.push(cb, self, libc);
      w = new LoopFdWatcher(api);
      return w;
    } catch {
      return null;
    }
  }

  private constructor(api: LoopApi) {
    this.api = api;
  }

  watch(fd: number, drain: Drain): void {
    this.drains.set(fd, drain);
    // An add of an fd already in the set is made a modify: it re-arms, a readable fd is reported.
    if (this.ctl(EPOLL_CTL_ADD, fd) < 0) this.ctl(EPOLL_CTL_MOD, fd);
  }

  unwatch(fd: number): void {
    // A remove of an fd closed meanwhile fails (the kernel removed it at close): fine.
    if (this.drains.delete(fd)) this.ctl(EPOLL_CTL_DEL, fd);
  }

  private ctl(op: number, fd: number): number {
    const one = this.one;
    one.fill(0);
    one.writeUInt32LE(EPOLLIN_ET, 0);
    one.writeInt32LE(fd, DATA);
    return this.api.epollCtl(this.api.ep, op, fd, one);
  }

  /** libuv's callback (poll phase): the drains run in this turn's check phase. */
  private onReadable(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(this.run);
  }

  private readonly run = (): void => {
    this.scheduled = false;
    const { api, events } = this;
    for (;;) {
      // Timeout 0: the set is known to be readable, or it is empty now and nothing is lost.
      const n = api.epollWait(api.ep, events, MAX, 0);
      if (n <= 0) return;
      for (let i = 0; i < n; i++) this.drains.get(events.readInt32LE(SIZE * i + DATA))?.();
      if (n < MAX) return;
    }
  };
}
