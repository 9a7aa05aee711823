/**
 * Passing the arena fd over SCM_RIGHTS, and only that.
 *
 * Node's `net` cannot send or receive ancillary data, so the one message that carries the
 * memfd (the HELLO reply) goes through usocket, a maintained npm package with a tiny native
 * addon (prebuilt by its install script) that does sendmsg/recvmsg with SCM_RIGHTS. Bulk
 * traffic stays on Node's own `net` stream: measured here, usocket's write path stalled on
 * multi-MiB writes to a usocket peer and its reader copies every recv into a fresh Buffer,
 * while libuv's pipe stream runs at the 2+ GB/s the machine allows. So each side borrows a
 * dup() of the connected socket for the handshake, wraps it in usocket, exchanges the fd,
 * closes the dup, and continues on `net` with the original descriptor. This keeps the
 * native surface to two well-used packages (koffi, usocket) instead of a custom N-API addon
 * that CI would have to compile.
 */
import { createRequire } from "node:module";
import net from "node:net";
import { libc } from "./libc.ts";

interface USocketLike {
  fd?: number;
  write(chunk: { data?: Buffer; fds?: number[]; callback?: () => void }): boolean;
  connect(path: string, cb?: () => void): void;
  on(ev: "data", fn: (b: Buffer) => void): void;
  on(ev: "fds", fn: (fds: number[]) => void): void;
  on(ev: "error" | "close", fn: (e?: Error) => void): void;
  removeAllListeners(ev?: string): void;
  pause(): void;
  destroy(): void;
}
interface USocketModule {
  USocket: new (opts?: { fd: number }) => USocketLike;
}

let usocketMod: USocketModule | null = null;
function usocket(): USocketModule {
  if (!usocketMod) usocketMod = createRequire(import.meta.url)("usocket") as USocketModule;
  return usocketMod;
}

/**
 * usocket's native close calls uv_close() on a uv_poll_t embedded in the wrapper object; if
 * the wrapper is garbage-collected before libuv runs the close callback, libuv touches freed
 * memory (seen here as an assertion in uv_poll_stop). Retiring a wrapper therefore happens
 * outside the native callback that delivered the data, and a strong reference is kept for a
 * second, long after the loop has finished closing the handle.
 */
const retired = new Set<USocketLike>();
/** Resolves once `u` is destroyed (its descriptor closed, its native reader gone). */
function retire(u: USocketLike): Promise<void> {
  retired.add(u);
  // Stop its native reader now, so bytes meant for the `net` stream that takes over the
  // descriptor cannot be consumed by usocket in the meantime.
  u.removeAllListeners();
  u.on("error", () => {});
  (u as unknown as { _wrap?: { pause?: () => void } })._wrap?.pause?.();
  return new Promise((resolve) =>
    setImmediate(() => {
      u.destroy();
      setTimeout(() => retired.delete(u), 1000).unref();
      setImmediate(resolve);
    }),
  );
}

/** The OS descriptor under a connected Unix-socket net.Socket (libuv pipe handle). */
export function socketFd(sock: net.Socket): number {
  const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== "number" || fd < 0) throw new Error("socket has no OS descriptor");
  return fd;
}

/**
 * Daemon side: writes `data` with `fds` attached on a dup of `sock`'s descriptor. The caller
 * must not write anything else on `sock` until this resolves, so ordering is preserved.
 */
export function sendWithFds(sock: net.Socket, data: Buffer, fds: number[]): Promise<void> {
  const c = libc();
  const dupFd = c.dup(socketFd(sock));
  if (dupFd < 0) return Promise.reject(new Error(`dup failed (errno ${c.errno()})`));
  return new Promise((resolve, reject) => {
    const u = new (usocket().USocket)({ fd: dupFd });
    u.on("error", (e) => {
      void retire(u);
      reject(e ?? new Error("usocket error"));
    });
    // usocket never starts reading an adopted fd until asked, so it cannot steal the
    // client's next request from `net`.
    u.write({
      data,
      fds,
      callback: () => {
        void retire(u);
        resolve();
      },
    });
  });
}

export interface HandshakeResult {
  sock: net.Socket;
  /** Every byte read before the socket was handed to `net` (the complete reply frame). */
  bytes: Buffer;
  fds: number[];
}

/**
 * Client side: connects with usocket, sends `hello`, reads until `frameLength(bytes)` says
 * a full reply has arrived (returns -1 while incomplete), collects any fds, then hands a dup
 * of the socket to `net`.
 */
export function connectWithFds(
  path: string,
  hello: Buffer,
  frameLength: (bytes: Buffer) => number,
  timeoutMs = 5000,
): Promise<HandshakeResult> {
  return new Promise((resolve, reject) => {
    const u = new (usocket().USocket)();
    const chunks: Buffer[] = [];
    const fds: number[] = [];
    let done = false;
    const timer = setTimeout(
      () => finish(new Error(`kvd handshake timed out after ${timeoutMs} ms`)),
      timeoutMs,
    );
    const finish = (err: Error | null, bytes?: Buffer) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      u.removeAllListeners();
      if (err) {
        void retire(u);
        for (const fd of fds) libc().close(fd);
        reject(err);
        return;
      }
      const c = libc();
      const fd = u.fd ?? -1;
      const dupFd = fd >= 0 ? c.dup(fd) : -1;
      const gone = retire(u);
      if (dupFd < 0) {
        reject(new Error("could not dup the handshake socket"));
        return;
      }
      // Handed over only once usocket's reader is gone: the caller's first request may be
      // answered within microseconds (a sunk PUT is answered from the read callback), and an
      // answer read by a usocket still winding down was lost, its request never resolved.
      void gone.then(() => {
        const sock = new net.Socket({ fd: dupFd, readable: true, writable: true });
        resolve({ sock, bytes: bytes ?? Buffer.alloc(0), fds });
      });
    };
    u.on("error", (e) => finish(e ?? new Error("usocket error")));
    u.on("close", () => finish(new Error("kvd closed the connection during the handshake")));
    u.on("fds", (got) => fds.push(...got));
    const onData = (b: Buffer) => {
      chunks.push(b);
      let need = -1;
      const all = Buffer.concat(chunks);
      try {
        need = frameLength(all);
      } catch (e) {
        finish(e as Error);
        return;
      }
      if (need >= 0 && all.length >= need) finish(null, all);
    };
    // Connect on a later tick, and subscribe to data only once connected: usocket's stream
    // asks its native side to read only if a reader exists after connect (a 'data' listener
    // attached before connect never starts reading; see spec/kvd-anchors.md).
    setImmediate(() => {
      try {
        u.connect(path, () => {
          u.on("data", onData);
          u.write({ data: hello });
        });
      } catch (e) {
        finish(e as Error);
      }
    });
  });
}
