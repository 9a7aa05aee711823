#!/usr/bin/env node
// Collects test/**/*.test.ts (or the paths given) and runs them with Node's built-in test runner.
// Node 24 runs the TypeScript as it is (type stripping: the sources use erasable syntax only,
// tsconfig's erasableSyntaxOnly). Started by an older node, it re-runs itself under the
// project-local Node 24 (scripts/install-node.sh).
import { spawnSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { ensureNode24 } from "./node-runtime.mjs";

await ensureNode24("run-tests");

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
  ["--test", `--test-concurrency=${concurrency}`, "--test-reporter=spec", ...files],
  { stdio: "inherit" },
);
process.exit(res.status ?? 1);
