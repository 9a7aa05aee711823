/**
 * Node client for kvd. Over the Unix socket it performs the HELLO handshake that receives
 * the arena memfd (SCM_RIGHTS), maps it, and then a GET returns Buffers that alias the
 * client's own mapping: zero copies, the bytes never cross the socket. Over TCP (or with
 * `arena: false`) GET falls back to the copy path.
 */
import net from "node:net";
import { type ArenaMapping, mapArena } from "./arena.ts";
import { connectWithFds } from "./native/fdpass.ts";
import { encodeFrame, FLAG_ERROR, type Frame, FrameDecoder, frameLength, Op } from "./protocol.ts";
import {
  newSocketReadStats,
  readFrames,
  SEND_BUFFER_BYTES,
  type SocketReadStats,
  widenSendBuffer,
} from "./socket-reader.ts";
import type { Retention, TierName } from "./types.ts";

export interface KvdClientOptions {
  socketPath?: string;
  tcp?: { host: string; port: number };
  namespace?: string;
  /** The daemon's TCP token (`--tcp-token-file` / INFERA_KVD_TCP_TOKEN), sent in HELLO. */
  token?: string;
  /** Map the shared arena (Unix socket only). Default true. */
  arena?: boolean;
  maxFrameBytes?: number;
  /** How long the fd-passing handshake may take (default 5 s). */
  handshakeTimeoutMs?: number;
  /**
   * Read a getCopyInto answer's bytes from the socket straight into the caller's buffer
   * (default true; falls back by itself where Node's internals differ, see socket-reader.ts).
   */
  directRead?: boolean;
  /**
   * SO_SNDBUF to ask for on the Unix socket (default SEND_BUFFER_BYTES, 4 MiB; 0: the OS
   * default): a PUT's chunk then leaves in one write instead of one per 208 KiB.
   */
  sendBufferBytes?: number;
}

export interface PutItem {
  key: string;
  data: Buffer;
  retention?: Retention;
  ttlMs?: number;
}

export interface ArenaChunk {
  key: string;
  tier: TierName;
  /** A view of the client's own mapping of the arena (or inline bytes if RAM was full). */
  buf: Buffer;
  offset: number;
  lease: number;
}

export class KvdRequestError extends Error {
  readonly status: number;
  readonly code: string | null;
  constructor(status: number, code: string | null, message: string) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class KvdClient {
  private readonly sock: net.Socket;
  readonly arena: ArenaMapping | null;
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (f: Frame) => void; reject: (e: Error) => void }>();
  private closedErr: Error | null = null;
  private readonly sinks = new Map<number, Buffer>();
  private helloMeta: Record<string, unknown> = {};
  private readonly reads: SocketReadStats = newSocketReadStats();

  private constructor(
    sock: net.Socket,
    arena: ArenaMapping | null,
    maxFrameBytes: number,
    leftover: Buffer,
    directRead: boolean,
    sendBufferBytes: number,
  ) {
    this.sock = sock;
    this.arena = arena;
    // getCopyInto: the response's bytes are received straight into the caller's buffer.
    const decoder = new FrameDecoder(maxFrameBytes, true, (_op, _meta, len, id) => {
      const dest = this.sinks.get(id);
      return dest && len <= dest.length ? { buf: dest.subarray(0, len), token: id } : null;
    });
    const onFrames = (frames: Frame[]) => {
      for (const f of frames) {
        const p = this.pending.get(f.id);
        if (!p) continue;
        this.pending.delete(f.id);
        p.resolve(f);
      }
    };
    if (leftover.length > 0) {
      try {
        onFrames(decoder.push(leftover));
      } catch (e) {
        this.fail(e as Error);
      }
    }
    // Installed before the loop reads anything: the socket was created in this same tick.
    readFrames(sock, {
      decoder,
      stats: this.reads,
      direct: directRead,
      closed: () => this.closedErr !== null,
      onFrames,
      onViolation: (why) => this.fail(new Error(`kvd sent an undecodable frame: ${why}`)),
    });
    sock.on("error", (e) => this.fail(e));
    sock.on("close", () => this.fail(new Error("kvd connection closed")));
    this.sendBuffer = widenSendBuffer(sock, sendBufferBytes);
  }

  /** The SO_SNDBUF the kernel granted this connection (-1: left at the OS default). */
  readonly sendBuffer: number;

  /** The daemon's HELLO reply. */
  get hello(): Readonly<Record<string, unknown>> {
    return this.helloMeta;
  }

  /** How this connection's reads were done (tests check the direct path was taken). */
  get readStats(): Readonly<SocketReadStats> {
    return { ...this.reads };
  }

  static async connect(o: KvdClientOptions): Promise<KvdClient> {
    const maxFrame = o.maxFrameBytes ?? 1024 * 1024 * 1024;
    const helloMeta = {
      namespace: o.namespace,
      arena: o.arena !== false && !!o.socketPath,
      client: "infera-node",
      ...(o.token !== undefined ? { token: o.token } : {}),
    };
    const direct = o.directRead !== false;
    const sndbuf = o.sendBufferBytes ?? SEND_BUFFER_BYTES;
    if (o.socketPath && helloMeta.arena) {
      const helloFrame = Buffer.concat(encodeFrame(Op.HELLO, 0, 0, helloMeta));
      const hs = await connectWithFds(o.socketPath, helloFrame, frameLength, o.handshakeTimeoutMs);
      const n = frameLength(hs.bytes);
      const [reply] = new FrameDecoder(maxFrame, true).push(hs.bytes.subarray(0, n));
      if (!reply?.meta.arena || hs.fds.length !== 1) {
        hs.sock.destroy();
        throw new Error("kvd did not pass the arena fd");
      }
      const arena = mapArena(hs.fds[0]!, Number(reply.meta.arena_bytes));
      const c = new KvdClient(hs.sock, arena, maxFrame, hs.bytes.subarray(n), direct, sndbuf);
      c.helloMeta = reply.meta;
      return c;
    }
    // No fd to receive: HELLO is an ordinary request on the client's own read path.
    const sock = o.socketPath ? net.connect(o.socketPath) : net.connect(o.tcp!.port, o.tcp!.host);
    if (!o.socketPath) sock.setNoDelay(true);
    const c = new KvdClient(sock, null, maxFrame, Buffer.alloc(0), direct, o.tcp ? 0 : sndbuf);
    c.helloMeta = (await c.request(Op.HELLO, helloMeta)).meta;
    return c;
  }

  private fail(e: Error): void {
    if (this.closedErr) return;
    this.closedErr = e;
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
    this.sock.destroy();
  }

  /** Sends one request frame; resolves with the response (rejects on an error frame). */
  async request(op: number, meta: object, data?: Buffer | Buffer[], into?: Buffer): Promise<Frame> {
    if (this.closedErr) throw this.closedErr;
    const id = this.nextId++ >>> 0;
    if (into) this.sinks.set(id, into);
    const p = new Promise<Frame>((resolve, reject) => this.pending.set(id, { resolve, reject }));
    this.sock.cork();
    for (const part of encodeFrame(op, 0, id, meta, data)) this.sock.write(part);
    this.sock.uncork();
    let f: Frame;
    try {
      f = await p;
    } finally {
      if (into) this.sinks.delete(id);
    }
    if (f.flags & FLAG_ERROR) {
      const err = (f.meta.error ?? {}) as { message?: string; code?: string };
      throw new KvdRequestError(Number(f.meta.status ?? 500), err.code ?? null, err.message ?? "kvd error");
    }
    return f;
  }

  async put(items: PutItem[], ns?: string): Promise<boolean[]> {
    const meta = {
      ns,
      items: items.map((i) => ({ key: i.key, size: i.data.length, retention: i.retention, ttl_ms: i.ttlMs })),
    };
    const f = await this.request(
      Op.PUT,
      meta,
      items.map((i) => i.data),
    );
    return f.meta.stored as boolean[];
  }

  /** Zero-copy PUT: reserve arena space, write it through the mapping, commit. */
  async putArena(items: PutItem[], ns?: string): Promise<boolean[]> {
    if (!this.arena) throw new Error("putArena needs the arena (Unix socket)");
    const meta = {
      ns,
      items: items.map((i) => ({ key: i.key, size: i.data.length, retention: i.retention, ttl_ms: i.ttlMs })),
    };
    const f = await this.request(Op.ALLOC, meta);
    const allocs = f.meta.allocs as ({ handle: number; offset: number } | null)[];
    const handles: number[] = [];
    allocs.forEach((a, i) => {
      if (!a) return;
      items[i]!.data.copy(this.arena!.buf, a.offset);
      handles.push(a.handle);
    });
    const c = await this.request(Op.COMMIT, { handles });
    const committed = c.meta.committed as boolean[];
    let j = 0;
    return allocs.map((a) => (a ? committed[j++]! : false));
  }

  /** GET through the arena: views of the client's own mapping, leased until release(). */
  async get(keys: string[], ns?: string): Promise<(ArenaChunk | null)[]> {
    const f = await this.request(Op.GET, { ns, keys });
    const items = f.meta.items as {
      found: boolean;
      tier: TierName;
      offset?: number;
      size: number;
      lease?: number;
      inline?: boolean;
    }[];
    let off = 0;
    return items.map((it, i) => {
      if (!it.found) return null;
      if (it.inline || !this.arena || it.offset === undefined) {
        const buf = f.data.subarray(off, off + it.size);
        off += it.size;
        return { key: keys[i]!, tier: it.tier, buf, offset: -1, lease: 0 };
      }
      const buf = this.arena.buf.subarray(it.offset, it.offset + it.size);
      return { key: keys[i]!, tier: it.tier, buf, offset: it.offset, lease: it.lease ?? 0 };
    });
  }

  /** GET over the socket (bytes copied through it). */
  async getCopy(keys: string[], ns?: string): Promise<(Buffer | null)[]> {
    const f = await this.request(Op.GET, { ns, keys, copy: true });
    const items = f.meta.items as { found: boolean; size: number }[];
    let off = 0;
    return items.map((it) => {
      if (!it.found) return null;
      const b = f.data.subarray(off, off + it.size);
      off += it.size;
      return b;
    });
  }

  /**
   * GET over the socket into a caller-owned buffer (like recv_into): no allocation per call.
   * Resolves with the chunk's size, or null on a miss. `dest` must be large enough.
   */
  async getCopyInto(key: string, dest: Buffer, ns?: string): Promise<number | null> {
    const f = await this.request(Op.GET, { ns, keys: [key], copy: true }, undefined, dest);
    const it = (f.meta.items as { found: boolean; size: number }[])[0];
    if (!it?.found) return null;
    if (f.sinkToken === undefined) f.data.copy(dest, 0, 0, it.size);
    return it.size;
  }

  async release(leases: number[]): Promise<number> {
    const real = leases.filter((l) => l > 0);
    if (real.length === 0) return 0;
    return (await this.request(Op.RELEASE, { leases: real })).meta.released as number;
  }

  async exists(keys: string[], ns?: string): Promise<(TierName | null)[]> {
    return (await this.request(Op.EXISTS, { ns, keys })).meta.tiers as (TierName | null)[];
  }

  async lookup(keys: string[], ns?: string): Promise<number> {
    return (await this.request(Op.LOOKUP, { ns, keys })).meta.prefix as number;
  }

  async delete(keys: string[], ns?: string): Promise<boolean[]> {
    return (await this.request(Op.DELETE, { ns, keys })).meta.deleted as boolean[];
  }

  async pin(keys: string[], ttlMs?: number, ns?: string): Promise<boolean[]> {
    return (await this.request(Op.PIN, { ns, keys, ttl_ms: ttlMs })).meta.pinned as boolean[];
  }

  async unpin(keys: string[], ns?: string): Promise<boolean[]> {
    return (await this.request(Op.UNPIN, { ns, keys })).meta.unpinned as boolean[];
  }

  async stats(): Promise<Record<string, unknown>> {
    return (await this.request(Op.STATS, {})).meta;
  }

  /**
   * Closes the connection (the daemon releases this client's leases). The arena mapping is
   * kept unless `unmap` is true, because Buffers returned by get() alias it and touching an
   * unmapped page is a SIGSEGV; pass true once no such Buffer is in use.
   */
  close(unmap = false): void {
    this.fail(new Error("client closed"));
    this.arena?.close(unmap);
  }
}
