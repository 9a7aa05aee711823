/**
 * The sim's personalities are objects (src/engine/sim/personalities/{vllm,sglang,atom}.ts),
 * looked up once by name in personalities/index.ts: outside that folder no sim source file
 * compares an engine's name (the old code had 26 such branches in 8 files, 11 in args.ts).
 * The same rule the router keeps for policy names (test/router/pipeline/no-name-checks.test.ts).
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const SIM = fileURLToPath(new URL("../../../src/engine/sim/", import.meta.url));
const NAME = `["'\`](?:vllm|sglang|atom)["'\`]`;
const COMPARE = new RegExp(
  `[!=]==?\\s*${NAME}|${NAME}\\s*[!=]==?|case\\s+${NAME}|new Set\\(\\[\\s*${NAME}|\\.includes\\(\\s*(?:cfg\\.)?engine\\b`,
);

function* files(dir: string): Generator<string> {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) {
      if (e.name !== "personalities") yield* files(p);
    } else if (p.endsWith(".ts")) yield p;
  }
}

test("the pattern catches the branches it forbids", () => {
  for (const line of [
    'if (cfg.engine === "atom") return;',
    "const x = engine !== 'vllm' ? 1 : 2;",
    '    case "sglang":',
    'if ("vllm" === engine) {}',
  ])
    assert.ok(COMPARE.test(line), line);
  assert.ok(!COMPARE.test('const p = personalityOf("vllm");'));
});

test("no sim source file outside personalities/ compares an engine name", () => {
  const hits: string[] = [];
  for (const f of files(SIM))
    readFileSync(f, "utf8")
      .split("\n")
      .forEach((line, i) => {
        if (COMPARE.test(line)) hits.push(`${f.slice(SIM.length)}:${i + 1}: ${line.trim()}`);
      });
  assert.deepEqual(hits, []);
});
