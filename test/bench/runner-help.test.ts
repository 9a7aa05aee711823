/**
 * The bench runners' `--help` prints the usage (the file's header comment, ../../bench/usage.ts)
 * and exits 0 without starting anything; before it, any invocation started a run of minutes
 * (a 15-minute fleet-routing run, a 20 GB kv-index build) and its children.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const RUNNERS: { name: string; title: RegExp; usage: RegExp; progress: RegExp }[] = [
  {
    name: "fleet-routing",
    title: /^Fleet routing under load/,
    usage: /\n {2}node bench\/fleet-routing\/run\.ts \[--quick\] \[--workers 8,16\]/,
    progress: /\[fleet-routing/,
  },
  {
    name: "kv-routing",
    title: /^KV-aware routing benchmark/,
    usage: /\n {2}node bench\/kv-routing\/run\.ts \[--speed 0\.5\]/,
    progress: /sims|server/,
  },
  {
    name: "fleet-scale",
    title: /^Scale of the router itself/,
    usage: /\n {2}node bench\/fleet-scale\/run\.ts \[--workers 256,1000\]/,
    progress: /fleet|server/,
  },
  {
    name: "kv-index",
    title: /^KvIndex benchmark/,
    usage: /\n {2}node --expose-gc .*bench\/kv-index\/run\.ts/,
    progress: /built|ingest/,
  },
];

for (const r of RUNNERS) {
  test(`${r.name} --help prints the usage and starts nothing`, () => {
    const run = fileURLToPath(new URL(`../../bench/${r.name}/run.ts`, import.meta.url));
    // The bound only keeps a regression (a real run) from hanging the suite.
    const out = spawnSync(process.execPath, [run, "--help"], { encoding: "utf8", timeout: 60_000 });
    assert.equal(out.status, 0, out.stderr);
    assert.match(out.stdout, r.title);
    assert.match(out.stdout, r.usage);
    assert.doesNotMatch(out.stdout, /^ \*/m, "comment markers stripped");
    assert.doesNotMatch(out.stdout, /\|---\|/, "no result table: nothing ran");
    // The runners log progress to stderr from their first step on: none ran.
    assert.doesNotMatch(out.stderr, r.progress);
  });
}
