/**
 * Capabilities come from the profiles' declared needs, never from the policy's name: no source
 * file compares a policy name (the old code did in app.ts, auto.ts, kv/server-ingest.ts and
 * nats/server-plug.ts). Preset names remain only as data (presets.ts, the deploy spec's enum,
 * CLI help, the config default).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { matchingLines } from "../../helpers/source-scan.ts";

const SRC = fileURLToPath(new URL("../../../src/", import.meta.url));
const NAME = `["'\`](?:kv-aware|round-robin|approx-prefix)["'\`]`;
const COMPARE = new RegExp(
  `[!=]==?\\s*${NAME}|${NAME}\\s*[!=]==?|new Set\\(\\[\\s*${NAME}|\\.includes\\(\\s*config\\.policy`,
);

test("no source file compares a policy name", () => {
  const hits = matchingLines(SRC, COMPARE);
  assert.deepEqual(hits, []);
});
