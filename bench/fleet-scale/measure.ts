/**
 * What the fleet-scale bench reads off processes and servers: CPU time and RSS from /proc, and
 * Prometheus text (counter sums, histogram quantiles between two scrapes).
 */
import { readdirSync, readFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";

/** Clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ, 100 on Linux). */
const USER_HZ = 100;

export interface CpuSample {
  /** utime + stime, in seconds. */
  cpu: number;
  /** stime alone (the kernel's share: socket reads and writes, epoll), in seconds. */
  sys: number;
  /** performance.now() when read, in seconds. */
  at: number;
}

/** The process's CPU seconds so far (threads included), or null once it is gone. */
export function cpuOf(pid: number): CpuSample | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces) start at state, field 3.
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return {
      cpu: (Number(f[11]) + Number(f[12])) / USER_HZ,
      sys: Number(f[12]) / USER_HZ,
      at: performance.now() / 1000,
    };
  } catch {
    return null;
  }
}

/**
 * CPU seconds per thread of a process, by thread name (/proc/<pid>/task/<tid>/stat; threads of
 * one name summed: V8's workers, libuv's pool). Node names a worker thread's main thread
 * "node" or its eval name; the main thread is "MainThread".
 */
export function threadCpuOf(pid: number): Record<string, number> {
  const out: Record<string, number> = {};
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      try {
        const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
        const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
        const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        out[name] = (out[name] ?? 0) + (Number(f[11]) + Number(f[12])) / USER_HZ;
      } catch {
        // the thread ended
      }
    }
  } catch {
    // the process ended
  }
  return out;
}

/** Share of one core the process used between two samples, in percent. */
export function cpuShare(a: CpuSample | null, b: CpuSample | null): number {
  if (!a || !b || b.at <= a.at) return Number.NaN;
  return (100 * (b.cpu - a.cpu)) / (b.at - a.at);
}

/** VmRSS and VmHWM (peak) in MiB, or NaN once the process is gone. */
export function rssOf(pid: number): { rssMiB: number; hwmMiB: number } {
  try {
    const s = readFileSync(`/proc/${pid}/status`, "utf8");
    const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, "m").exec(s)?.[1] ?? Number.NaN);
    return { rssMiB: kb("VmRSS") / 1024, hwmMiB: kb("VmHWM") / 1024 };
  } catch {
    return { rssMiB: Number.NaN, hwmMiB: Number.NaN };
  }
}

export function load(): string {
  return loadavg()
    .map((x) => x.toFixed(2))
    .join(" ");
}

/** The machine's busy and total jiffies over all cores (/proc/stat's first line). */
function machineJiffies(): { busy: number; total: number } {
  const f = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  // idle + iowait are not busy.
  return { busy: total - f[3] - (f[4] ?? 0), total };
}

/**
 * CPU shares of named processes over a window, in % of one core, and `machine`: the whole box's
 * busy share in % of one core too (every process on it, the other helpers' included).
 */
export function cpuWindow(pids: Record<string, number>): { end(): Record<string, number> } {
  const start = Object.fromEntries(Object.entries(pids).map(([k, p]) => [k, cpuOf(p)]));
  const threads0 = Object.fromEntries(
    Object.entries(pids)
      .filter(([k]) => k.startsWith("server"))
      .map(([k, p]) => [k, threadCpuOf(p)]),
  );
  const m0 = machineJiffies();
  return {
    end: () => {
      const m1 = machineJiffies();
      const cores = cpus().length;
      return {
        ...Object.fromEntries(
          Object.entries(pids).flatMap(([k, p]) => {
            const now = cpuOf(p);
            const share: [string, number][] = [[k, round1(cpuShare(start[k], now))]];
            // A server's kernel time apart: what its sockets cost beside its own code.
            if (k.startsWith("server") && start[k] && now && now.at > start[k].at)
              share.push([`${k}Kernel`, round1((100 * (now.sys - start[k].sys)) / (now.at - start[k].at))]);
            // …and its threads apart from the main one (the KV fd watcher, GC helpers, libuv's pool).
            const t0 = threads0[k];
            if (t0 && start[k] && now && now.at > start[k].at) {
              const t1 = threadCpuOf(p);
              const secs = now.at - start[k].at;
              let other = 0;
              for (const [name, c] of Object.entries(t1)) {
                const d = c - (t0[name] ?? 0);
                if (name === "MainThread") share.push([`${k}Main`, round1((100 * d) / secs)]);
                else other += d;
                if (process.env.FLEET_THREADS && d > 0)
                  process.stderr.write(`  ${k} thread ${name}: ${round1((100 * d) / secs)}%\n`);
              }
              share.push([`${k}OtherThreads`, round1((100 * other) / secs)]);
            }
            return share;
          }),
        ),
        machine: round1((100 * cores * (m1.busy - m0.busy)) / Math.max(1, m1.total - m0.total)),
      };
    },
  };
}

export const round1 = (x: number): number => Math.round(x * 10) / 10;

/** Sum of every series of a counter or gauge (any labels), optionally only those whose labels match. */
export function sumOf(text: string, name: string, labels?: RegExp): number {
  let sum = 0;
  const re = new RegExp(`^${name}(\\{[^}]*\\})? (\\S+)$`, "gm");
  for (const m of text.matchAll(re)) if (!labels || labels.test(m[1] ?? "")) sum += Number(m[2]);
  return sum;
}

/** Every series of a counter by one label's value. */
export function byLabel(text: string, name: string, label: string): Record<string, number> {
  const out: Record<string, number> = {};
  const re = new RegExp(`^${name}\\{([^}]*)\\} (\\S+)$`, "gm");
  for (const m of text.matchAll(re)) {
    const v = new RegExp(`${label}="([^"]*)"`).exec(m[1])?.[1] ?? "";
    out[v] = (out[v] ?? 0) + Number(m[2]);
  }
  return out;
}

/** A histogram's cumulative bucket counts (le → count), summed over series matching `labels`. */
export function bucketsOf(text: string, name: string, labels?: RegExp): Map<number, number> {
  const out = new Map<number, number>();
  const re = new RegExp(`^${name}_bucket\\{([^}]*)\\} (\\S+)$`, "gm");
  for (const m of text.matchAll(re)) {
    if (labels && !labels.test(m[1])) continue;
    const le = /le="([^"]*)"/.exec(m[1])?.[1];
    if (le === undefined) continue;
    const k = le === "+Inf" ? Number.POSITIVE_INFINITY : Number(le);
    out.set(k, (out.get(k) ?? 0) + Number(m[2]));
  }
  return out;
}

/**
 * The q-quantile of the observations made between two scrapes (cumulative buckets), linearly
 * interpolated inside the bucket as Prometheus' histogram_quantile does; NaN without samples.
 * Past the last finite bound it answers that bound (the true value is only known to be above).
 */
export function quantileBetween(before: Map<number, number>, after: Map<number, number>, q: number): number {
  const les = [...after.keys()].sort((a, b) => a - b);
  const d = les.map((le) => (after.get(le) ?? 0) - (before.get(le) ?? 0));
  const total = d[d.length - 1] ?? 0;
  if (total <= 0) return Number.NaN;
  const rank = q * total;
  for (let i = 0; i < les.length; i++) {
    if (d[i] >= rank) {
      if (!Number.isFinite(les[i])) return les[i - 1] ?? Number.NaN;
      const lo = i === 0 ? 0 : les[i - 1];
      const below = i === 0 ? 0 : d[i - 1];
      const inBucket = d[i] - below;
      return inBucket > 0 ? lo + ((les[i] - lo) * (rank - below)) / inBucket : les[i];
    }
  }
  return Number.NaN;
}

/** Sum and count of a histogram's observations between two scrapes: the mean. */
export function meanBetween(before: string, after: string, name: string, labels?: RegExp): number {
  const s = sumOf(after, `${name}_sum`, labels) - sumOf(before, `${name}_sum`, labels);
  const c = sumOf(after, `${name}_count`, labels) - sumOf(before, `${name}_count`, labels);
  return c > 0 ? s / c : Number.NaN;
}

export async function scrape(url: string): Promise<string> {
  const r = await fetch(`${url}/metrics`);
  return r.text();
}
