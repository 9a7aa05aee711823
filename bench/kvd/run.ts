/**
 * kvd benchmark, one run, everything side by side:
 *  - GET/PUT of 1, 4 and 16 MiB chunks through the arena (zero-copy) vs the socket copy path,
 *    against raw Unix-socket bandwidth between two Node processes and memcpy (Buffer.copy);
 *  - L3 write/read vs `dd` on the same disk (conv=fdatasync for writes, iflag=direct for reads;
 *    kvd's reads run after posix_fadvise(DONTNEED) so both read from the device, not the cache).
 * Run: node bench/kvd/run.ts   (≈1 min)
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { KvdClient } from "../../src/kvd/client.ts";
import { libc, POSIX_FADV_DONTNEED } from "../../src/kvd/native/libc.ts";
import { DiskTier } from "../../src/kvd/tiers/disk.ts";
import { chunkId } from "../../src/kvd/types.ts";
import { createLogger } from "../../src/util/log.ts";

const MiB = 1024 * 1024;
const SIZES = [1, 4, 16].map((m) => m * MiB);
const PER_MEASURE = Number(process.env.KVD_BENCH_BYTES ?? 256 * MiB);
const REPEATS = 3;
/** Requests in flight on the socket paths (the raw-socket baseline is a continuous stream). */
const WINDOW = Number(process.env.KVD_BENCH_WINDOW ?? 4);
const WARMUP_ROUNDS = Number(process.env.KVD_BENCH_WARMUP ?? 10);
const root = mkdtempSync(join(process.env.KVD_BENCH_DIR ?? tmpdir(), "kvd-bench-"));
const gbps = (bytes: number, ms: number) => bytes / 1e9 / (ms / 1000);

async function best(fn: () => Promise<number>): Promise<number> {
  let b = 0;
  for (let i = 0; i < REPEATS; i++) b = Math.max(b, await fn());
  return b;
}

async function timeIt(bytes: number, fn: () => Promise<void>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return gbps(bytes, performance.now() - t0);
}

/** Runs `fn` over `items` with up to `window` requests in flight (bandwidth, not latency). */
async function pipelined<T>(items: T[], window: number, fn: (t: T) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(window, items.length) }, async () => {
      while (next < items.length) await fn(items[next++]!);
    }),
  );
}

async function startDaemon(sock: string): Promise<ChildProcess> {
  const child = spawn(
    process.execPath,
    [join(import.meta.dirname, "../../bin/infera.js"), "kvd", "--socket", sock, "--ram-bytes", "768MiB"],
    { env: { ...process.env, INFERA_LOG_LEVEL: "warn" }, stdio: ["ignore", "ignore", "inherit"] },
  );
  for (let i = 0; i < 300 && !existsSync(sock); i++) await new Promise((r) => setTimeout(r, 50));
  return child;
}

/**
 * Raw Unix-socket bandwidth: another process streams `count` × `size` bytes. With `copy`,
 * the receiver also copies every read into one `size`-byte buffer, as any consumer that
 * needs the chunk contiguous must (kvd's socket paths do exactly that one copy).
 */
function rawSocket(size: number, count: number, copy = false): Promise<number> {
  const path = join(root, `raw-${size}-${copy}.sock`);
  const dest = copy ? Buffer.alloc(size) : null;
  return new Promise((resolve, reject) => {
    let got = 0;
    let t0 = 0;
    const srv = net.createServer((c) => {
      t0 = performance.now();
      c.on("data", (d: Buffer) => {
        if (dest) d.copy(dest, got % size);
        got += d.length;
      });
      c.on("end", () => {
        const g = gbps(got, performance.now() - t0);
        srv.close();
        resolve(g);
      });
    });
    srv.listen(path, () => {
      const child = spawn(
        process.execPath,
        [join(import.meta.dirname, "raw-socket.ts"), path, String(size), String(count)],
        {
          stdio: "ignore",
        },
      );
      child.on("error", reject);
    });
  });
}

function memcpy(size: number, count: number): number {
  const a = Buffer.alloc(size, 1);
  const b = Buffer.alloc(size);
  const t0 = performance.now();
  for (let i = 0; i < count; i++) a.copy(b);
  return gbps(size * count, performance.now() - t0);
}

function dd(args: string[]): number {
  const t0 = performance.now();
  execFileSync("dd", args, { stdio: "ignore" });
  return performance.now() - t0;
}

interface Row {
  size: number;
  putSocket: number;
  putArena: number;
  getSocket: number;
  getArena: number;
  getArenaRead: number;
  raw: number;
  rawCopy: number;
  memcpy: number;
}

let readPaths: { daemon: unknown; client: unknown } | null = null;

/** WARMUP_ROUNDS × 64 pipelined 1 MiB PUTs, socket-copy GETs and DELETEs. */
async function warmUp(c: KvdClient): Promise<void> {
  const data = Buffer.alloc(MiB, 0x11);
  const dests = Array.from({ length: WINDOW }, () => Buffer.alloc(MiB));
  const keys = Array.from({ length: 64 }, (_, i) => `warm-${i}`);
  for (let r = 0; r < WARMUP_ROUNDS; r++) {
    await pipelined(keys, WINDOW, (key) => c.put([{ key, data, retention: "short" }]));
    let slot = 0;
    await pipelined(keys, WINDOW, (k) => c.getCopyInto(k, dests[slot++ % WINDOW]!));
    await c.delete(keys);
  }
}

async function arenaBench(): Promise<Row[]> {
  const sock = join(root, "kvd.sock");
  const daemon = await startDaemon(sock);
  const c = await KvdClient.connect({ socketPath: sock, namespace: "bench" });
  const rows: Row[] = [];
  try {
    // Untimed warm-up, so the first measurement (1 MiB PUT) is not the daemon's and client's
    // unoptimised code: V8 compiles their hot paths on threads that count in the figures.
    await warmUp(c);
    for (const size of SIZES) {
      const n = Math.max(4, Math.floor(PER_MEASURE / size));
      const total = n * size;
      const data = Buffer.alloc(size, 0x33);
      const keysOf = (p: string) => Array.from({ length: n }, (_, i) => `${p}${size}-${i}`);
      // `short` keeps the chunks in RAM (no write-through) so the measurement is the path
      // itself; each repeat deletes its chunks afterwards (untimed) so the arena never fills.
      const putSocket = await best(async () => {
        const keys = keysOf("s");
        const g = await timeIt(total, async () => {
          await pipelined(keys, WINDOW, (key) => c.put([{ key, data, retention: "short" }]));
        });
        await c.delete(keys);
        return g;
      });
      const keys = keysOf("a");
      const putArena = await best(async () => {
        await c.delete(keys);
        return timeIt(total, async () => {
          for (const key of keys) await c.putArena([{ key, data, retention: "short" }]);
        });
      });
      // Received into caller-owned buffers (one per request in flight), as an engine would
      // into its staging buffers: a fresh 16 MiB allocation per GET costs page faults that
      // have nothing to do with the socket path.
      const dests = Array.from({ length: WINDOW }, () => Buffer.alloc(size));
      const getSocket = await best(() =>
        timeIt(total, async () => {
          let slot = 0;
          await pipelined(keys, WINDOW, (k) => c.getCopyInto(k, dests[slot++ % WINDOW]!));
        }),
      );
      const getArena = await best(() =>
        timeIt(total, async () => {
          for (const k of keys) {
            const [g] = await c.get([k]);
            await c.release([g!.lease]);
          }
        }),
      );
      const sink = Buffer.alloc(size);
      const getArenaRead = await best(() =>
        timeIt(total, async () => {
          for (const k of keys) {
            const [g] = await c.get([k]);
            g!.buf.copy(sink);
            await c.release([g!.lease]);
          }
        }),
      );
      const raw = await best(() => rawSocket(size, n));
      const rawCopy = await best(() => rawSocket(size, n, true));
      rows.push({
        rawCopy,
        size,
        putSocket,
        putArena,
        getSocket,
        getArena,
        getArenaRead,
        raw,
        memcpy: memcpy(size, n),
      });
      await c.delete(keys);
    }
    // Which read path carried the bytes (direct into reservations / caller buffers, or the
    // 'data' fallback): a figure is only meaningful with its path.
    readPaths = { daemon: (await c.stats()).socket_reads, client: c.readStats };
  } finally {
    c.close();
    daemon.kill("SIGTERM");
  }
  return rows;
}

async function diskBench(): Promise<Record<string, number>> {
  const dir = join(root, "l3");
  mkdirSync(dir, { recursive: true });
  const size = 16 * MiB;
  const n = Math.max(4, Math.floor(PER_MEASURE / size));
  const total = n * size;
  const disk = new DiskTier(dir, 8 * 1024 * MiB, createLogger("bench").child({}, { level: "silent" }));
  disk.open();
  const data = Buffer.alloc(size, 0x44);
  const t0 = performance.now();
  // The daemon writes through concurrently (one write per PUT in flight); do the same here.
  await pipelined(
    Array.from({ length: n }, (_, i) => i),
    WINDOW,
    (i) => disk.write("bench", `d${i}`, [data], "long", 0),
  );
  const l3Write = gbps(total, performance.now() - t0);
  const c = libc();
  for (let i = 0; i < n; i++) {
    const fd = openSync(disk.index.get(chunkId("bench", `d${i}`))!.path, "r");
    c.fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    closeSync(fd);
  }
  const t1 = performance.now();
  for (let i = 0; i < n; i++)
    if (!(await disk.read(chunkId("bench", `d${i}`)))) throw new Error("L3 read miss");
  const l3Read = gbps(total, performance.now() - t1);
  const f = join(root, "dd.bin");
  const ddWrite = gbps(total, dd(["if=/dev/zero", `of=${f}`, "bs=16M", `count=${n}`, "conv=fdatasync"]));
  const ddRead = gbps(total, dd([`if=${f}`, "of=/dev/null", "bs=16M", "iflag=direct"]));
  return { l3Write, l3Read, ddWrite, ddRead };
}

const fmt = (x: number) => x.toFixed(2).padStart(7);
const pct = (x: number) => `${(x * 100).toFixed(0)}%`;

const started = performance.now();
const rows = await arenaBench();
const d = await diskBench();
rmSync(root, { recursive: true, force: true });

console.log(
  `kvd bench (GB/s, best of ${REPEATS}, ${PER_MEASURE / MiB} MiB per measurement, ${WINDOW} requests in flight on socket paths)`,
);
console.log("chunk   PUT-sock PUT-arena GET-sock GET-arena GET-arena+read raw-sock raw+copy  memcpy");
for (const r of rows) {
  console.log(
    `${String(r.size / MiB).padStart(2)} MiB ${fmt(r.putSocket)}  ${fmt(r.putArena)} ${fmt(r.getSocket)}  ${fmt(r.getArena)}        ${fmt(r.getArenaRead)} ${fmt(r.raw)}  ${fmt(r.rawCopy)} ${fmt(r.memcpy)}`,
  );
}
const r16 = rows.find((r) => r.size === 16 * MiB)!;
const zc = r16.getArena / r16.getSocket;
console.log("\ngoals");
console.log(
  `zero-copy GET / socket-copy GET, 16 MiB: ${zc.toFixed(1)}x (goal >= 10x) ${zc >= 10 ? "MET" : "MISSED"}`,
);
for (const r of rows) {
  const g = r.getSocket / r.raw;
  const p = r.putSocket / r.raw;
  console.log(
    `socket path / raw socket, ${r.size / MiB} MiB: GET ${pct(g)}, PUT ${pct(p)} (goal >= 80%) ${g >= 0.8 && p >= 0.8 ? "MET" : "MISSED"}` +
      `; vs raw+copy: GET ${pct(r.getSocket / r.rawCopy)}, PUT ${pct(r.putSocket / r.rawCopy)}`,
  );
}
console.log(`read paths: ${JSON.stringify(readPaths)}`);
const lw = d.l3Write / d.ddWrite;
const lr = d.l3Read / d.ddRead;
console.log(
  `L3 write ${fmt(d.l3Write)} vs dd conv=fdatasync ${fmt(d.ddWrite)}: ${pct(lw)} (goal >= 80%) ${lw >= 0.8 ? "MET" : "MISSED"}`,
);
console.log(
  `L3 read  ${fmt(d.l3Read)} vs dd iflag=direct  ${fmt(d.ddRead)}: ${pct(lr)} (goal >= 80%) ${lr >= 0.8 ? "MET" : "MISSED"}`,
);
console.log(
  `(load average at end: ${(await import("node:os"))
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}; ${((performance.now() - started) / 1000).toFixed(0)} s)`,
);
