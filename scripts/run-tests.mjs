#!/usr/bin/env node
// Collects test/**/*.test.ts (or the paths given) and runs them with Node's built-in test runner
// through tsx. Node 20's runner does not glob .ts files by itself.
import { spawnSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";

function collect(path, out) {
  const st = statSync(path);
  if (st.isFile()) {
    if (path.endsWith(".test.ts")) out.push(path);
    return out;
  }
  for (const name of readdirSync(path).sort()) collect(join(path, name), out);
  return out;
}

const args = process.argv.slice(2);
const roots = args.length > 0 ? args : ["test"];
const files = roots.flatMap((r) => collect(r, []));
if (files.length === 0) {
  console.error("no test files found under", roots.join(", "));
  process.exit(1);
}
const concurrency = process.env.INFERA_TEST_CONCURRENCY ?? "2";
const res = spawnSync(
  process.execPath,
  ["--import", "tsx", "--test", `--test-concurrency=${concurrency}`, "--test-reporter=spec", ...files],
  { stdio: "inherit" },
);
process.exit(res.status ?? 1);
