#!/usr/bin/env node
// Collects test/**/*.test.ts (or the paths given) and runs them with Node's built-in test runner.
// Node 24 runs the TypeScript as it is (type stripping: the sources use erasable syntax only,
// tsconfig's erasableSyntaxOnly). Started by an older node, it re-runs itself under the
// project-local Node 24 (scripts/install-node.sh).
//
// `--timings[=out.json]`: runs each file in its own `node --test` process instead (a pool of
// INFERA_TEST_CONCURRENCY at a time; 1 gives the cleanest per-file figures), prints the
// failing files' output and a table of the slowest files by wall time with their CPU time,
// and writes every file's times to out.json when given. docs/ci.md keeps the before/after table it produced.
//
// Before the tests it builds dist/ (scripts/build.mjs, about a second) when dist/ is missing or
// older than src/: the processes the tests start (bin/infera.js, bin/infera-sim.js: hundreds
// of them) then load one bundle instead of every source module, 20-30 % less CPU each; CI's
// `npm ci` builds it anyway (npm's `prepare`). INFERA_DIST=0 keeps the sources.
import { spawn, spawnSync } from "node:child_process";
import { readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { chooseEntry } from "./dist-stamp.mjs";
import { ensureNode24 } from "./node-runtime.mjs";

await ensureNode24("run-tests");

if (process.env.INFERA_DIST !== "0" && chooseEntry() !== "dist") {
  const built = spawnSync(process.execPath, [new URL("./build.mjs", import.meta.url).pathname], {
    stdio: "inherit",
  });
  if (built.status !== 0) console.error("run-tests: building dist/ failed; the tests run the sources");
}

function collect(path, out) {
  const st = statSync(path);
  if (st.isFile()) {
    if (path.endsWith(".test.ts")) out.push(path);
    return out;
  }
  for (const name of readdirSync(path).sort()) collect(join(path, name), out);
  return out;
}

const argv = process.argv.slice(2);
const timingsArg = argv.find((a) => a === "--timings" || a.startsWith("--timings="));
const args = argv.filter((a) => a !== timingsArg);
const roots = args.length > 0 ? args : ["test"];
const files = roots.flatMap((r) => collect(r, []));
if (files.length === 0) {
  console.error("no test files found under", roots.join(", "));
  process.exit(1);
}
const concurrency = process.env.INFERA_TEST_CONCURRENCY ?? "2";

// The CPU time (user + sys) of the file's whole process tree, from the shell's `times` (the
// children it waited for, and theirs): on a shared, loaded box wall time mostly measures the
// neighbours, CPU time much less so.
const TIMED = 'node="$1"; shift; "$node" "$@"; rc=$?; times >&2; exit $rc';

function cpuSeconds(text) {
  const m = [...text.matchAll(/^(\d+)m([\d.]+)s (\d+)m([\d.]+)s$/gm)].at(-1);
  return m ? Number(m[1]) * 60 + Number(m[2]) + Number(m[3]) * 60 + Number(m[4]) : Number.NaN;
}

/** One file in its own test process: its wall and CPU time, exit status and output. */
function runOne(file) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const child = spawn("sh", ["-c", TIMED, "sh", process.execPath, "--test", "--test-reporter=spec", file], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    const chunks = [];
    child.stdout.on("data", (c) => chunks.push(c));
    child.stderr.on("data", (c) => chunks.push(c));
    child.on("close", (code) => {
      const ms = Math.round(performance.now() - t0);
      const output = Buffer.concat(chunks).toString("utf8");
      resolve({ file, ms, cpu: cpuSeconds(output), ok: code === 0, output });
    });
  });
}

async function timings(all, pool, outPath) {
  const queue = [...all];
  const results = [];
  const t0 = performance.now();
  async function worker() {
    for (let f = queue.shift(); f !== undefined; f = queue.shift()) {
      const r = await runOne(f);
      results.push(r);
      const cpu = `${r.cpu.toFixed(1).padStart(6)} s cpu`;
      process.stderr.write(
        `${r.ok ? "ok  " : "FAIL"} ${(r.ms / 1000).toFixed(1).padStart(6)} s  ${cpu}  ${f}\n`,
      );
      if (!r.ok) process.stdout.write(r.output);
    }
  }
  await Promise.all(Array.from({ length: Math.max(1, pool || 1) }, worker));
  const wall = Math.round(performance.now() - t0);
  results.sort((a, b) => b.ms - a.ms);
  const sum = results.reduce((s, r) => s + r.ms, 0);
  console.log(
    `\n${results.length} files, wall ${(wall / 1000).toFixed(1)} s, sum ${(sum / 1000).toFixed(1)} s`,
  );
  console.log("slowest files:");
  for (const r of results.slice(0, 15)) {
    console.log(
      `  ${(r.ms / 1000).toFixed(1).padStart(6)} s  ${r.cpu.toFixed(1).padStart(6)} s cpu  ${r.file}`,
    );
  }
  if (outPath) {
    const data = {
      wallMs: wall,
      concurrency: pool,
      files: results.map(({ file, ms, cpu, ok }) => ({ file, ms, cpuS: Math.round(cpu * 100) / 100, ok })),
    };
    writeFileSync(outPath, `${JSON.stringify(data, null, 2)}\n`);
  }
  return results.every((r) => r.ok) ? 0 : 1;
}

if (timingsArg) process.exit(await timings(files, Number(concurrency), timingsArg.split("=")[1]));

const res = spawnSync(
  process.execPath,
  ["--test", `--test-concurrency=${concurrency}`, "--test-reporter=spec", ...files],
  { stdio: "inherit" },
);
process.exit(res.status ?? 1);
