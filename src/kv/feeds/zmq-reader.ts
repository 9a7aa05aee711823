/**
 * How a ZmqKvFeed's SUB socket is read: through libzmq's C API (./zmq-native.ts; many messages
 * per wake-up, each handled synchronously) or through zeromq.js (one awaited `receive()` per
 * message, the fallback where the native reader does not load). Either way a message whose
 * handling returns a promise (a replay, a restart check) stops reading until it settles, and
 * a busy socket yields to the event loop every YIELD_AFTER_MS so timers and HTTP (/health)
 * keep running. The socket connects when opened (so live batches queue during the start-up
 * replay) and is read from `start()`.
 */
import { Subscriber } from "zeromq";
import "../../util/zmq-limits.ts";
import { FdWatcher } from "./fd-watcher.ts";
import type { KvZmqReader } from "./types.ts";
import { loadNativeZmq, type NativeFrames, NativeSub } from "./zmq-native.ts";

/** Yield to the event loop after this much continuous work, so /health stays responsive. */
const YIELD_AFTER_MS = 20;

export interface ZmqReaderHooks {
  /**
   * One message. Its frames may be views of buffers the next read reuses (`reusesFrames`):
   * copy what must outlive the call. A promise: read nothing more until it settles.
   */
  message(frames: Uint8Array[]): Promise<void> | undefined;
  /** The PUB side dropped the connection (the engine may have restarted behind it). */
  disconnected(): void;
  malformed(error: string): void;
  /** Reading stopped on an error. */
  failed(err: unknown): void;
}

export interface ZmqReader {
  readonly kind: KvZmqReader;
  /** The frames given to `message` are reused by the next read. */
  readonly reusesFrames: boolean;
  /** Starts reading (call once). */
  start(): void;
  close(): void;
}

/** Opens (connects and subscribes) a SUB on `endpoint`: native unless `want` is zeromq. */
export function openZmqReader(
  endpoint: string,
  topic: string,
  want: KvZmqReader | undefined,
  hooks: ZmqReaderHooks,
): ZmqReader {
  const z = want === "zeromq" ? null : loadNativeZmq();
  return z
    ? new NativeReader(new NativeSub(z, endpoint, topic), FdWatcher.get(z), hooks)
    : new ZeromqReader(endpoint, topic, hooks);
}

class NativeReader implements ZmqReader {
  readonly kind = "native";
  readonly reusesFrames = true;
  private closed = false;
  private paused = false;
  private readonly sub: NativeSub;
  private readonly watcher: FdWatcher;
  private readonly hooks: ZmqReaderHooks;

  constructor(sub: NativeSub, watcher: FdWatcher, hooks: ZmqReaderHooks) {
    this.sub = sub;
    this.watcher = watcher;
    this.hooks = hooks;
  }

  start(): void {
    if (this.closed) return;
    this.watcher.watch(this.sub.monitorFd, () => {
      if (this.sub.disconnected()) this.hooks.disconnected();
    });
    this.watcher.watch(this.sub.fd, this.drain);
    this.drain();
  }

  close(): void {
    this.closed = true;
    this.watcher.unwatch(this.sub.fd);
    this.watcher.unwatch(this.sub.monitorFd);
    this.sub.close();
  }

  /** Reads until the socket would block (or a message needs waiting for, or it is time to yield). */
  private readonly drain = (): void => {
    if (this.paused || this.closed) return;
    const start = performance.now();
    for (;;) {
      const f = this.sub.read();
      if (!f) return;
      const slow = this.one(f);
      if (slow) {
        this.pause(slow);
        return;
      }
      // Checked after every message (≈ 40 ns): one batch can carry thousands of blocks.
      if (performance.now() - start > YIELD_AFTER_MS) {
        setImmediate(this.drain);
        return;
      }
    }
  };

  private one(f: NativeFrames): Promise<void> | undefined {
    if (f.truncated) {
      this.hooks.malformed("a frame over the native reader's cap");
      return;
    }
    // More frames than views kept: still a message of that many frames (malformed for any framing).
    return this.hooks.message(f.views.length === f.count ? f.views : [...f.views, new Uint8Array(0)]);
  }

  private pause(slow: Promise<void>): void {
    this.paused = true;
    // Unwatched meanwhile: the fd stays readable until the socket is read again.
    this.watcher.unwatch(this.sub.fd);
    void slow
      .catch((err) => this.hooks.failed(err))
      .finally(() => {
        this.paused = false;
        if (this.closed) return;
        this.watcher.watch(this.sub.fd, this.drain);
        this.drain();
      });
  }
}

class ZeromqReader implements ZmqReader {
  readonly kind = "zeromq";
  readonly reusesFrames = false;
  private readonly sub = new Subscriber({ linger: 0 });
  private readonly hooks: ZmqReaderHooks;
  private closed = false;

  constructor(endpoint: string, topic: string, hooks: ZmqReaderHooks) {
    this.hooks = hooks;
    this.sub.events.on("disconnect", () => hooks.disconnected());
    this.sub.connect(endpoint);
    if (topic) this.sub.subscribe(topic);
    else this.sub.subscribe();
  }

  start(): void {
    this.loop().catch((err) => {
      if (!this.closed) this.hooks.failed(err);
    });
  }

  close(): void {
    this.closed = true;
    try {
      this.sub.close();
    } catch {
      // already closed
    }
  }

  private async loop(): Promise<void> {
    let workStart = performance.now();
    while (!this.closed) {
      let frames: Buffer[];
      try {
        frames = await this.sub.receive();
      } catch (err) {
        if (this.closed) return;
        throw err;
      }
      await this.hooks.message(frames);
      // Queued messages resolve receive() without a trip through the event loop; a publisher
      // flooding the socket must not starve timers and HTTP (/health).
      if (performance.now() - workStart > YIELD_AFTER_MS) {
        await new Promise<void>((r) => setImmediate(r));
        workStart = performance.now();
      }
    }
  }
}
