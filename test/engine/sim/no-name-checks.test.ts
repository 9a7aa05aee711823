/**
 * The sim's personalities are objects (src/engine/sim/personalities/{vllm,sglang,atom}.ts),
 * looked up once by name in personalities/index.ts: outside that folder no sim source file
 * compares an engine's name (the old code had 26 such branches in 8 files, 11 in args.ts).
 * The same rule the router keeps for policy names (test/router/pipeline/no-name-checks.test.ts).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { matchingLines } from "../../helpers/source-scan.ts";

const SIM = fileURLToPath(new URL("../../../src/engine/sim/", import.meta.url));
const NAME = `["'\`](?:vllm|sglang|atom)["'\`]`;
const COMPARE = new RegExp(
  `[!=]==?\\s*${NAME}|${NAME}\\s*[!=]==?|case\\s+${NAME}|new Set\\(\\[\\s*${NAME}|\\.includes\\(\\s*(?:cfg\\.)?engine\\b`,
);

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
  const hits = matchingLines(SIM, COMPARE, ["personalities"]);
  assert.deepEqual(hits, []);
});
