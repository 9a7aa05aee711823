/**
 * KV-event ingest ceiling (issue #32 "KV-event ingest"): N vLLM-framed messages from a separate
 * publisher process (./publisher.ts) into one KvSubscriber + KvIndex in a receiver process
 * (./receiver.ts). Per variant: received msg/s, the receiver's CPU µs per message (all its
 * threads), sequence gaps and messages lost, and with `--cpu-prof` the receiver's top-10
 * self-time functions. Variants run one after the other in one invocation, so they share the
 * box's load (printed; the box is shared):
 *
 *   name=SRC:READER  SRC: a checkout's root (e.g. a worktree of the commit before the change),
 *                    READER: native | zeromq (what KvSubscriberOptions.reader selects; a
 *                    checkout without the option ignores it)
 *
 *   node bench/kv-ingest/run.ts [--n 300000] [--events 1] [--rate 0] [--cpu-prof]
 *     [--variants before=/tmp/base:zeromq,zeromq=.:zeromq,native=.:native]
 *
 * `--rate 0` sends flat out (the publisher outruns the receiver: losses show the receiver's
 * ceiling); `--rate R` paces R msg/s (losses 0 means it kept up).
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { exitWithUsageIfAsked } from "../usage.ts";

const args = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, args);
const opt = (name: string, def: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const N = Number(opt("n", "300000"));
const EVENTS = Number(opt("events", "1"));
const RATE = Number(opt("rate", "0"));
const PROF = args.includes("--cpu-prof");
const VARIANTS = opt("variants", "zeromq=.:zeromq,native=.:native")
  .split(",")
  .map((v) => {
    const [name, rest] = v.split("=");
    const [src, reader] = rest.split(":");
    return { name, src, reader };
  });
const here = new URL(".", import.meta.url).pathname;
const load = () =>
  loadavg()
    .map((x) => x.toFixed(2))
    .join(" ");

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => resolve(p));
    });
  });
}

function start(file: string, argv: string[], nodeArgs: string[] = []) {
  const child = spawn(process.execPath, [...nodeArgs, join(here, file), ...argv], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout });
  const queue: string[] = [];
  const waiters: ((l: string) => void)[] = [];
  lines.on("line", (l) => {
    const w = waiters.shift();
    if (w) w(l);
    else queue.push(l);
  });
  const next = () =>
    new Promise<string>((r) => {
      const l = queue.shift();
      if (l !== undefined) r(l);
      else waiters.push(r);
    });
  const exited = new Promise<void>((r) => child.on("exit", () => r()));
  return { child, next, exited };
}

interface Profile {
  nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number } }[];
  samples: number[];
  timeDeltas: number[];
}

/** The top-10 self-time functions of a .cpuprofile (idle and the GC row included). */
function topSelf(file: string): string[] {
  const p = JSON.parse(readFileSync(file, "utf8")) as Profile;
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map<string, number>();
  let total = 0;
  p.samples.forEach((id, i) => {
    const cf = byId.get(id)?.callFrame;
    if (!cf) return;
    const where = cf.url ? ` ${cf.url.split("/").slice(-2).join("/")}:${cf.lineNumber + 1}` : "";
    const key = `${cf.functionName || "(anonymous)"}${where}`;
    const dt = p.timeDeltas[i] ?? 0;
    self.set(key, (self.get(key) ?? 0) + dt);
    total += dt;
  });
  return [...self]
    .sort((a, b) => b[1] - a[1])
    .slice(0, Number(process.env.TOP ?? 10))
    .map(
      ([k, t]) =>
        `${(t / 1000).toFixed(0).padStart(6)} ms ${((100 * t) / total).toFixed(1).padStart(5)} %  ${k}`,
    );
}

const rows: string[] = [];
const profiles: string[] = [];
console.log(`kv-ingest: n=${N} events/msg=${EVENTS} rate=${RATE || "flat out"}; load ${load()}`);
for (const v of VARIANTS) {
  const port = await freePort();
  const ep = `tcp://127.0.0.1:${port}`;
  const pub = start("publisher.ts", [ep, String(N), String(EVENTS), String(RATE)]);
  const ready = await pub.next();
  const profDir = PROF ? mkdtempSync(join(tmpdir(), "kv-ingest-prof-")) : "";
  const rec = start(
    "receiver.ts",
    [ep, String(N), v.src, v.reader],
    PROF ? ["--cpu-prof", `--cpu-prof-dir=${profDir}`] : [],
  );
  await rec.next();
  // Let the SUB's connection and subscription reach the PUB before anything is sent.
  await new Promise((r) => setTimeout(r, 500));
  const loadBefore = load();
  pub.child.stdin.write("go\n");
  const sent = JSON.parse(await pub.next());
  const got = JSON.parse(await rec.next());
  await Promise.all([pub.exited, rec.exited]);
  const lost = N - got.received;
  rows.push(
    `| ${v.name} | ${v.reader} | ${got.received} | ${got.rate.toLocaleString("en")} | ${got.cpuUsPerMsg.toFixed(2)} | ${Math.round(1e6 / got.cpuUsPerMsg).toLocaleString("en")} | ${got.gaps} | ${lost} | ${sent.rate.toLocaleString("en")} | ${ready.split(" ")[1]} | ${loadBefore} |`,
  );
  console.log(rows[rows.length - 1]);
  if (PROF) {
    const f = readdirSync(profDir).find((x) => x.endsWith(".cpuprofile"));
    if (f)
      profiles.push(`${v.name} (${v.reader}), top 10 self time:\n${topSelf(join(profDir, f)).join("\n")}`);
  }
}
console.log(
  "\n| variant | reader | received | msg/s | CPU µs/msg | msg/s per core (1e6 / CPU µs) | gaps | lost | publisher msg/s | payload B | load before |",
);
console.log("|---|---|---|---|---|---|---|---|---|---|---|");
for (const r of rows) console.log(r);
for (const p of profiles) console.log(`\n${p}`);
console.log(`\nload after: ${load()}`);
