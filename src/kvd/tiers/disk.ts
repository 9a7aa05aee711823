/**
 * L3: one file per chunk under `dir/<2 hex>/<40 hex>.kv`.
 *
 * Layout: header | payload. The header holds magic, version, class, sizes, the payload's
 * crc32, creation and expiry times, the namespace and key, and ends with a crc32 of the
 * header itself. A file is written under a temporary name, fsync'd, then renamed into place:
 * rename is atomic, so a reader (or the start-up scan) sees either no file or a complete
 * one; and because both header and payload are checksummed and verified on every read, a
 * torn or bit-rotted file is detected, deleted and reported as a miss, never served.
 * (The directory is not fsync'd per chunk: after a power cut a just-renamed chunk may be
 * missing, which is a cache miss, never a corrupt hit.)
 */
import { createHash, randomBytes } from "node:crypto";
import { closeSync, mkdirSync, openSync, readdirSync, readSync, rmSync, statSync } from "node:fs";
import { open, readFile, rename, unlink } from "node:fs/promises";
import { join } from "node:path";
import { crc32 } from "node:zlib";
import type { Logger } from "../../util/log.ts";
import { ClassLru } from "../lru.ts";
import { chunkId, type StoredClass } from "../types.ts";

const FILE_MAGIC = 0x4344564b; // "KVDC"
const FILE_VERSION = 1;
const WRITE_CONCURRENCY = 4;
const FIXED = 4 + 2 + 2 + 4 + 8 + 4 + 8 + 8 + 2 + 2; // up to the namespace bytes

export interface DiskEntry {
  ns: string;
  key: string;
  size: number;
  cls: StoredClass;
  expiresAt: number;
  path: string;
}

export function encodeHeader(
  ns: string,
  key: string,
  cls: StoredClass,
  payload: Buffer[],
  expiresAt: number,
) {
  const nsB = Buffer.from(ns, "utf8");
  const keyB = Buffer.from(key, "utf8");
  let size = 0;
  let crc = 0;
  for (const p of payload) {
    size += p.length;
    crc = crc32(p, crc);
  }
  const h = Buffer.alloc(FIXED + nsB.length + keyB.length + 4);
  let o = h.writeUInt32LE(FILE_MAGIC, 0);
  o = h.writeUInt16LE(FILE_VERSION, o);
  o = h.writeUInt16LE(cls === "short" ? 1 : 2, o);
  o = h.writeUInt32LE(h.length, o);
  o = h.writeDoubleLE(size, o);
  o = h.writeUInt32LE(crc, o);
  o = h.writeDoubleLE(Date.now(), o);
  o = h.writeDoubleLE(expiresAt, o);
  o = h.writeUInt16LE(nsB.length, o);
  o = h.writeUInt16LE(keyB.length, o);
  o += nsB.copy(h, o);
  o += keyB.copy(h, o);
  h.writeUInt32LE(crc32(h.subarray(0, o)), o);
  return h;
}

interface Header {
  headerLen: number;
  size: number;
  crc: number;
  cls: StoredClass;
  expiresAt: number;
  ns: string;
  key: string;
}

/** Parses and verifies a header; null when anything is off. */
export function decodeHeader(b: Buffer): Header | null {
  if (b.length < FIXED + 4 || b.readUInt32LE(0) !== FILE_MAGIC || b.readUInt16LE(4) !== FILE_VERSION)
    return null;
  const headerLen = b.readUInt32LE(8);
  if (headerLen > b.length || headerLen < FIXED + 4) return null;
  if (crc32(b.subarray(0, headerLen - 4)) !== b.readUInt32LE(headerLen - 4)) return null;
  const nsLen = b.readUInt16LE(FIXED - 4);
  const keyLen = b.readUInt16LE(FIXED - 2);
  if (FIXED + nsLen + keyLen + 4 !== headerLen) return null;
  return {
    headerLen,
    size: b.readDoubleLE(12),
    crc: b.readUInt32LE(20),
    cls: b.readUInt16LE(6) === 1 ? "short" : "long",
    expiresAt: b.readDoubleLE(32),
    ns: b.toString("utf8", FIXED, FIXED + nsLen),
    key: b.toString("utf8", FIXED + nsLen, FIXED + nsLen + keyLen),
  };
}

export class DiskTier {
  readonly dir: string;
  readonly capacity: number;
  private readonly log: Logger;
  readonly index = new Map<string, DiskEntry>();
  private readonly lru = new ClassLru();
  private readonly pending = new Map<string, { cancelled: boolean }>();
  private usedBytes = 0;
  private tmpSeq = 0;
  private writing = 0;
  private readonly waiters: (() => void)[] = [];
  evictions: Record<StoredClass, number> = { short: 0, long: 0 };
  /** Files found corrupt (on scan or read) and deleted. */
  corrupt = 0;

  constructor(dir: string, capacity: number, log: Logger) {
    this.dir = dir;
    this.capacity = capacity;
    this.log = log;
  }

  get used(): number {
    return this.usedBytes;
  }

  /** Rebuilds the index from the files on disk; deletes temp files and invalid headers. */
  open(): void {
    mkdirSync(this.dir, { recursive: true });
    const found: Array<DiskEntry & { mtime: number }> = [];
    for (const name of readdirSync(this.dir)) {
      const p = join(this.dir, name);
      if (name.startsWith(".tmp-")) {
        rmSync(p, { force: true });
        continue;
      }
      if (!/^[0-9a-f]{2}$/.test(name)) continue;
      for (const f of readdirSync(p)) {
        const fp = join(p, f);
        const e = this.scanFile(fp);
        if (e) found.push(e);
      }
    }
    // Oldest first, so the LRU order after a restart follows the files' age.
    found.sort((a, b) => a.mtime - b.mtime);
    for (const e of found) this.insert(e);
    this.log.info({ chunks: this.index.size, bytes: this.usedBytes, dir: this.dir }, "kvd L3 index rebuilt");
  }

  private scanFile(fp: string): (DiskEntry & { mtime: number }) | null {
    try {
      const st = statSync(fp);
      const head = Buffer.alloc(Math.min(st.size, 64 * 1024));
      const fd = openSync(fp, "r");
      let n = 0;
      try {
        n = readSync(fd, head, 0, head.length, 0);
      } finally {
        closeSync(fd);
      }
      const h = decodeHeader(head.subarray(0, n));
      if (!h || h.headerLen + h.size !== st.size) throw new Error("bad header or length");
      return {
        ns: h.ns,
        key: h.key,
        size: h.size,
        cls: h.cls,
        expiresAt: h.expiresAt,
        path: fp,
        mtime: st.mtimeMs,
      };
    } catch (e) {
      this.corrupt++;
      this.log.warn({ file: fp, err: String(e) }, "kvd L3 dropped an invalid chunk file at start-up");
      rmSync(fp, { force: true });
      return null;
    }
  }

  pathFor(ns: string, key: string): string {
    const h = createHash("sha256").update(ns).update("\u0000").update(key).digest("hex");
    return join(this.dir, h.slice(0, 2), `${h.slice(2, 42)}.kv`);
  }

  has(id: string): boolean {
    const e = this.index.get(id);
    return e !== undefined && (e.expiresAt === 0 || e.expiresAt > Date.now());
  }

  isPending(id: string): boolean {
    return this.pending.has(id);
  }

  /** Writes one chunk crash-safely. Returns false when it cannot fit or was cancelled. */
  async write(
    ns: string,
    key: string,
    payload: Buffer[],
    cls: StoredClass,
    expiresAt: number,
  ): Promise<boolean> {
    const id = chunkId(ns, key);
    if (this.index.has(id) || this.pending.has(id)) return true;
    let size = 0;
    for (const p of payload) size += p.length;
    if (size > this.capacity || !this.makeRoom(size)) return false;
    const state = { cancelled: false };
    this.pending.set(id, state);
    // Reserve the bytes now so concurrent writes do not overshoot the budget.
    this.usedBytes += size;
    const tmp = join(this.dir, `.tmp-${process.pid}-${++this.tmpSeq}-${randomBytes(4).toString("hex")}`);
    const dest = this.pathFor(ns, key);
    await this.slot();
    try {
      const header = encodeHeader(ns, key, cls, payload, expiresAt);
      const fh = await open(tmp, "w", 0o600);
      try {
        await fh.writev([header, ...payload]);
        // fdatasync: the data and the size (needed to read it back) reach the disk; mtime
        // and other metadata need not.
        await fh.datasync();
      } finally {
        await fh.close();
      }
      mkdirSync(join(dest, ".."), { recursive: true });
      await rename(tmp, dest);
      this.usedBytes -= size;
      if (state.cancelled) {
        await unlink(dest).catch(() => {});
        return false;
      }
      this.insert({ ns, key, size, cls, expiresAt, path: dest });
      return true;
    } catch (e) {
      this.usedBytes -= size;
      await unlink(tmp).catch(() => {});
      this.log.warn({ err: String(e), key }, "kvd L3 write failed");
      return false;
    } finally {
      this.pending.delete(id);
      this.unslot();
    }
  }

  /**
   * At most WRITE_CONCURRENCY files are being written at once: enough to keep a device
   * queue busy while one write waits in fdatasync, without a storm of PUTs opening
   * hundreds of files and interleaving their fsyncs.
   */
  private async slot(): Promise<void> {
    if (this.writing < WRITE_CONCURRENCY) {
      this.writing++;
      return;
    }
    await new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  private unslot(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.writing--;
  }

  /** Reads and verifies a chunk. Corrupt or expired files are deleted and read as a miss. */
  async read(id: string): Promise<Buffer | null> {
    const e = this.index.get(id);
    if (!e) return null;
    if (e.expiresAt !== 0 && e.expiresAt <= Date.now()) {
      this.delete(id);
      return null;
    }
    let file: Buffer;
    try {
      file = await readFile(e.path);
    } catch {
      this.drop(id);
      return null;
    }
    const h = decodeHeader(file);
    const payload = h ? file.subarray(h.headerLen) : null;
    if (
      !h ||
      !payload ||
      payload.length !== h.size ||
      crc32(payload) !== h.crc ||
      h.ns !== e.ns ||
      h.key !== e.key
    ) {
      this.corrupt++;
      this.log.warn({ file: e.path }, "kvd L3 chunk failed its checksum; deleted");
      this.delete(id);
      return null;
    }
    this.lru.touch(id, e.cls);
    return payload;
  }

  delete(id: string): boolean {
    const p = this.pending.get(id);
    if (p) p.cancelled = true;
    const e = this.index.get(id);
    if (!e) return p !== undefined;
    this.drop(id);
    rmSync(e.path, { force: true });
    return true;
  }

  /** Deletes expired chunks; returns how many. */
  sweep(now = Date.now()): number {
    let n = 0;
    for (const [id, e] of this.index) {
      if (e.expiresAt !== 0 && e.expiresAt <= now) {
        this.delete(id);
        n++;
      }
    }
    return n;
  }

  private makeRoom(size: number): boolean {
    if (this.usedBytes + size <= this.capacity) return true;
    this.sweep();
    for (const [id, cls] of this.lru.victims()) {
      if (this.usedBytes + size <= this.capacity) break;
      this.delete(id);
      this.evictions[cls]++;
    }
    return this.usedBytes + size <= this.capacity;
  }

  private insert(e: DiskEntry): void {
    const id = chunkId(e.ns, e.key);
    this.index.set(id, e);
    this.lru.add(id, e.cls);
    this.usedBytes += e.size;
  }

  private drop(id: string): void {
    const e = this.index.get(id);
    if (!e) return;
    this.index.delete(id);
    this.lru.remove(id);
    this.usedBytes -= e.size;
  }
}
