#!/usr/bin/env node
/**
 * Top-N self time of a V8 CPU profile (`node --cpu-prof` writes one .cpuprofile per process).
 *
 *   node scripts/cpu-prof-top.mjs <file.cpuprofile | dir> [--top 10] [--markdown] [--window START,END]
 *
 * A directory means every .cpuprofile in it, summed. Self time is the samples whose top frame is
 * the function (by name + url + line), times the sampling interval, as Chrome DevTools' "Self
 * time" column shows it; `(idle)` and `(program)` stay in, so the share of busy time is visible.
 *
 * `--window START,END`: only samples taken between the two instants, in µs on the profile's own
 * clock (CLOCK_MONOTONIC on Linux, as `process.hrtime` in any process of the machine reads it:
 * bench/fleet-scale records each phase's window as `profileWindowUs`), to leave start-up out.
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";

const argv = process.argv.slice(2);
const path = argv.find((a, i) => !a.startsWith("--") && !["--top", "--window"].includes(argv[i - 1]));
if (!path) {
  console.error(
    "usage: node scripts/cpu-prof-top.mjs <file.cpuprofile | dir> [--top 10] [--markdown] [--window START,END]",
  );
  process.exit(2);
}
const topIdx = argv.indexOf("--top");
const TOP = topIdx >= 0 ? Number(argv[topIdx + 1]) : 10;
const MARKDOWN = argv.includes("--markdown");
const winIdx = argv.indexOf("--window");
const [FROM, TO] = winIdx >= 0 ? argv[winIdx + 1].split(",").map(Number) : [-Infinity, Infinity];

const files = statSync(path).isDirectory()
  ? readdirSync(path)
      .filter((f) => f.endsWith(".cpuprofile"))
      .map((f) => join(path, f))
  : [path];

/** µs of self time per function key. */
const self = new Map();
let total = 0;
for (const f of files) {
  const prof = JSON.parse(readFileSync(f, "utf8"));
  const keyOf = new Map();
  for (const n of prof.nodes) {
    const cf = n.callFrame;
    const where = cf.url ? `${basename(cf.url)}:${cf.lineNumber + 1}` : "";
    keyOf.set(n.id, `${cf.functionName || "(anonymous)"}${where ? ` ${where}` : ""}`);
  }
  // timeDeltas[i] is the time since the previous sample: attribute it to sample i.
  const { samples, timeDeltas } = prof;
  let t = prof.startTime;
  for (let i = 0; i < samples.length; i++) {
    const dt = Math.max(0, timeDeltas[i] ?? 0);
    t += timeDeltas[i] ?? 0;
    if (t < FROM || t > TO) continue;
    const k = keyOf.get(samples[i]);
    self.set(k, (self.get(k) ?? 0) + dt);
    total += dt;
  }
}
const idle = self.get("(idle)") ?? 0;
const rows = [...self].sort((a, b) => b[1] - a[1]).slice(0, TOP);
const busy = total - idle;
console.log(
  `${files.length} profile(s), ${(total / 1e6).toFixed(2)} s sampled, ${(busy / 1e6).toFixed(2)} s busy (not idle)`,
);
if (MARKDOWN) {
  console.log("| # | function | self ms | % of busy |\n|---|---|---|---|");
  rows.forEach(([k, us], i) => {
    console.log(
      `| ${i + 1} | \`${k}\` | ${(us / 1e3).toFixed(0)} | ${k === "(idle)" ? "–" : ((us / busy) * 100).toFixed(1)} |`,
    );
  });
} else {
  for (const [k, us] of rows)
    console.log(
      `${(us / 1e3).toFixed(0).padStart(8)} ms  ${k === "(idle)" ? "   –  " : `${((us / busy) * 100).toFixed(1).padStart(5)}%`}  ${k}`,
    );
}
