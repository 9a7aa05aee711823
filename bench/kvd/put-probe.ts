/**
 * Probe for the socket PUT path alone: pipelined single-item PUTs (`short` retention, WINDOW
 * in flight, as bench/kvd/run.ts does) against a daemon on KVD_SOCK (started separately, e.g.
 * under `node --cpu-prof`), printing GB/s per round. Not part of the bench's figures.
 * Run: KVD_SOCK=/path.sock node bench/kvd/put-probe.ts [sizeMiB] [rounds]
 */
import { readFileSync } from "node:fs";
import { KvdClient } from "../../src/kvd/client.ts";

/** utime+stime of a process in ms (Linux /proc; clock ticks assumed 100 Hz). */
function procCpu(pid: string | undefined): [number, number] {
  if (!pid) return [0, 0];
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return [Number(f[11]) * 10, Number(f[12]) * 10];
}

const MiB = 1024 * 1024;
const size = Number(process.argv[2] ?? 1) * MiB;
const rounds = Number(process.argv[3] ?? 10);
const WINDOW = Number(process.env.KVD_BENCH_WINDOW ?? 4);
const n = Math.max(4, Math.floor((256 * MiB) / size));
const c = await KvdClient.connect({ socketPath: process.env.KVD_SOCK!, namespace: "bench" });
console.log(`SO_SNDBUF granted: ${c.sendBuffer}`);
const data = Buffer.alloc(size, 0x33);
for (let r = 0; r < rounds; r++) {
  const keys = Array.from({ length: n }, (_, i) => `p${size}-${r}-${i}`);
  let next = 0;
  const d0 = procCpu(process.env.KVD_PID);
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: WINDOW }, async () => {
      while (next < n) await c.put([{ key: keys[next++]!, data, retention: "short" }]);
    }),
  );
  const ms = performance.now() - t0;
  const cu = process.cpuUsage(c0);
  const d1 = procCpu(process.env.KVD_PID);
  const dcpu = d1[0] - d0[0] + d1[1] - d0[1];
  console.log(
    `round ${r}: ${((n * size) / 1e9 / (ms / 1000)).toFixed(2)} GB/s, ${((ms / n) * 1000).toFixed(0)} us/req; ` +
      `client cpu ${(((cu.user + cu.system) / 1000 / ms) * 100).toFixed(0)}% (sys ${((cu.system / 1000 / ms) * 100).toFixed(0)}%), daemon cpu ${((dcpu / ms) * 100).toFixed(0)}% (sys ${(((d1[1] - d0[1]) / ms) * 100).toFixed(0)}%)`,
  );
  await c.delete(keys);
}
c.close();
