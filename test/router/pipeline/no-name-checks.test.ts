/**
 * Capabilities come from the profiles' declared needs, never from the policy's name: no source
 * file compares a policy name (the old code did in app.ts, auto.ts, kv/server-ingest.ts and
 * nats/server-plug.ts). Preset names remain only as data (presets.ts, the deploy spec's enum,
 * CLI help, the config default).
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const SRC = fileURLToPath(new URL("../../../src/", import.meta.url));
const NAME = `["'\`](?:kv-aware|round-robin|approx-prefix)["'\`]`;
const COMPARE = new RegExp(
  `[!=]==?\\s*${NAME}|${NAME}\\s*[!=]==?|new Set\\(\\[\\s*${NAME}|\\.includes\\(\\s*config\\.policy`,
);

function* files(dir: string): Generator<string> {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) yield* files(p);
    else if (p.endsWith(".ts")) yield p;
  }
}

test("no source file compares a policy name", () => {
  const hits: string[] = [];
  for (const f of files(SRC))
    readFileSync(f, "utf8")
      .split("\n")
      .forEach((line, i) => {
        if (COMPARE.test(line)) hits.push(`${f.slice(SRC.length)}:${i + 1}: ${line.trim()}`);
      });
  assert.deepEqual(hits, []);
});
