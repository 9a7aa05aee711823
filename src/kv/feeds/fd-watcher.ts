/**
 * The process's one fd watcher for the native KV readers (./zmq-native.ts): a worker thread that
 * waits on every watched socket's ZMQ_FD and tells the main thread which to drain. Node has no
 * public way to watch an arbitrary fd, and the sockets themselves are not thread safe, so the
 * worker only waits and reports; the main thread reads.
 */
import { MessageChannel, type MessagePort, Worker } from "node:worker_threads";
import koffi from "koffi";
import { LoopFdWatcher } from "./loop-fd-watcher.ts";

type Fn<A extends unknown[], R> = (...args: A) => R;

/**
 * Run in the worker: wait in epoll for any watched fd to be signalled and report it to the main
 * thread, which drains the socket.
 *
 * epoll, not poll(): poll() hands the kernel every fd on each call (registering on and leaving
 * each one's wait queue), so one wake-up cost O(watched fds) — ≈ 100 µs of this thread's CPU per
 * KV event at 256 workers (513 fds), a tenth of a core at 1,000 events/s spread over the fleet,
 * the usual shape (one message per wake-up). epoll_wait costs O(ready fds).
 *
 * Edge-triggered (EPOLLET): a ZMQ_FD is libzmq's mailbox eventfd, written each time a command
 * arrives while the socket's reader is passive — after a read found its mailbox empty; a recv
 * that finds nothing processes the commands with a zero timeout first, so a drain to EAGAIN
 * leaves it passive (zeromq/libzmq src/mailbox.cpp `send`: `if (!ok) _signaler.send ()`, `recv`;
 * src/signaler.cpp `send` writes the eventfd, `recv_failable` reads it and writes back any
 * signals it took too many, one more report at worst; src/socket_base.cpp `recv` @
 * 6b708e4a453a31e240211792f42e4f0c67b7fc03) — and every eventfd write is an epoll event. The
 * main thread drains each reported socket until EAGAIN, so the next arrival writes again and is
 * reported: nothing is lost, and the watcher need not wait for the drain (level-triggered poll()
 * had to, one futex wait and wake per event on both threads).
 *
 * The fd set changes by ordered ops from the main thread ([1, fd] add, [2, fd] remove), so a
 * number closed and reused is removed, then added again; an add reports an fd already readable.
 * struct epoll_event is packed on x86-64 (12 bytes, data at 4), 16 bytes elsewhere (data at 8)
 * (linux include/uapi/linux/eventpoll.h, EPOLL_PACKED).
 */
const WATCHER_SOURCE = `
const { workerData, receiveMessageOnPort } = require("node:worker_threads");
const koffi = require(workerData.koffi);
const libc = koffi.load("libc.so.6");
const epollCreate = libc.func("int epoll_create1(int)");
const epollCtl = libc.func("int epoll_ctl(int, int, int, void *)");
const epollWait = libc.func("int epoll_wait(int, void *, int, int)");
const read = libc.func("long read(int, _Out_ uint8_t *, unsigned long)");
const port = workerData.port;
const wakeFd = workerData.wakeFd;
const junk = Buffer.alloc(8);
const SIZE = process.arch === "x64" ? 12 : 16;
const DATA = process.arch === "x64" ? 4 : 8;
const MAX = 1024;
const events = Buffer.alloc(SIZE * MAX);
const one = Buffer.alloc(SIZE);
// EPOLL_CLOEXEC; EPOLL_CTL_ADD 1, _DEL 2, _MOD 3; EPOLLIN 1, EPOLLET 1 << 31 (sys/epoll.h).
const ep = epollCreate(0o2000000);
if (ep < 0) throw new Error("epoll_create1 failed");
function ctl(op, fd) {
  one.fill(0);
  one.writeUInt32LE((1 | 0x80000000) >>> 0, 0);
  one.writeInt32LE(fd, DATA);
  // An add of an fd already there is made a modify (it re-arms: a readable fd is reported); a
  // remove of one closed meanwhile fails (the kernel removed it at close): both fine.
  if (epollCtl(ep, op, fd, one) < 0 && op === 1) epollCtl(ep, 3, fd, one);
}
ctl(1, wakeFd);
for (;;) {
  let m;
  while ((m = receiveMessageOnPort(port))) {
    if (m.message === null) process.exit(0);
    const ops = m.message;
    for (let i = 0; i < ops.length; i += 2) ctl(ops[i], ops[i + 1]);
  }
  const n = epollWait(ep, events, MAX, 1000);
  if (n <= 0) continue;
  const ready = [];
  for (let i = 0; i < n; i++) {
    const fd = events.readInt32LE(SIZE * i + DATA);
    if (fd === wakeFd) read(wakeFd, junk, 8);
    else ready.push(fd);
  }
  if (ready.length > 0) port.postMessage(ready);
}
`;

type Drain = () => void;

/**
 * The process's one fd watcher: `watch(fd, drain)` calls `drain` on the main thread whenever
 * the fd turns readable; `drain` must read its socket until it would block (or unwatch it).
 */
export interface FdWatcher {
  watch(fd: number, drain: Drain): void;
  unwatch(fd: number): void;
}

let one: FdWatcher | null = null;

export const FdWatcher = {
  /**
   * The process's watcher: on the main thread's own loop where libuv can be reached
   * (./loop-fd-watcher.ts, one wake-up per arrival instead of two), else the worker thread
   * below. `INFERA_KV_FD_WATCHER=thread` picks the thread.
   */
  get(z: { koffiPath: string }): FdWatcher {
    one ??= LoopFdWatcher.create() ?? new ThreadFdWatcher(z);
    return one;
  },
};

/** The watcher as a worker thread waiting in epoll (WATCHER_SOURCE), reporting over a MessagePort. */
export class ThreadFdWatcher implements FdWatcher {
  private readonly worker: Worker;
  private readonly port: MessagePort;
  private readonly drains = new Map<number, Drain>();
  /** Ops not yet sent to the worker: pairs of (1 add | 2 remove, fd). */
  private ops: number[] = [];
  private readonly wakeFd: number;
  private readonly wake: (fd: number) => void;

  /** `z`: where koffi lives (the worker loads libc through it); any loaded ZmqApi has it. */
  constructor(z: { koffiPath: string }) {
    const libc = koffi.load("libc.so.6");
    const eventfd = libc.func("int eventfd(unsigned int, int)") as Fn<[number, number], number>;
    const write = libc.func("long write(int, const uint8_t *, unsigned long)") as Fn<
      [number, Uint8Array, number],
      number
    >;
    // EFD_NONBLOCK | EFD_CLOEXEC (linux/eventfd.h).
    this.wakeFd = eventfd(0, 0o4000 | 0o2000000);
    if (this.wakeFd < 0) throw new Error("eventfd failed");
    const one = Buffer.alloc(8);
    one.writeBigUInt64LE(1n);
    this.wake = (fd) => void write(fd, one, 8);
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    this.worker = new Worker(WATCHER_SOURCE, {
      eval: true,
      workerData: { koffi: z.koffiPath, port: port2, wakeFd: this.wakeFd },
      transferList: [port2],
    });
    this.worker.unref();
    // The watcher gone means no socket would ever be read again: fail loudly, not silently.
    this.worker.on("error", (err) => {
      throw err;
    });
    this.port.on("message", (ready: number[]) => this.onReady(ready));
    this.port.unref();
    // The worker sits in epoll_wait (up to 1 s); at exit Node waits for it, so it is told to
    // stop now rather than holding the process for that second.
    process.once("exit", () => {
      this.port.postMessage(null);
      this.wake(this.wakeFd);
    });
  }

  watch(fd: number, drain: Drain): void {
    this.drains.set(fd, drain);
    this.publish(1, fd);
  }

  unwatch(fd: number): void {
    if (this.drains.delete(fd)) this.publish(2, fd);
  }

  /**
   * One op for the worker's epoll set, in call order; the ops of one tick go in one message
   * (a fleet's start-up watches thousands of fds), with one wake-up.
   */
  private publish(op: 1 | 2, fd: number): void {
    if (this.ops.length === 0)
      queueMicrotask(() => {
        const ops = this.ops;
        this.ops = [];
        this.port.postMessage(ops);
        this.wake(this.wakeFd);
      });
    this.ops.push(op, fd);
  }

  private onReady(ready: number[]): void {
    for (const fd of ready) this.drains.get(fd)?.();
  }
}
