/**
 * scripts/check-fn-length.mjs (issue #33 item 1): a function over the limit fails the check
 * unless a `// long: <why>` comment stands right above it; arrows, methods and nested
 * functions count; --report lists without failing.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

const script = join(dirname(fileURLToPath(import.meta.url)), "../../scripts/check-fn-length.mjs");
const dirs: string[] = [];
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A function body of `n` lines in all (header and closing brace included). */
const body = (n: number) => Array.from({ length: n - 2 }, (_, i) => `  x += ${i};`).join("\n");

function check(files: Record<string, string>, ...args: string[]): { status: number | null; out: string } {
  const root = mkdtempSync(join(tmpdir(), "check-fn-length-"));
  dirs.push(root);
  for (const [name, text] of Object.entries(files)) writeFileSync(join(root, name), text);
  const res = spawnSync(process.execPath, [script, root, "--max", "10", ...args], { encoding: "utf8" });
  return { status: res.status, out: res.stdout + res.stderr };
}

test("functions within the limit pass", () => {
  const r = check({ "a.ts": `export function f() {\n  let x = 0;\n${body(8)}\n  return x;\n}\n` });
  assert.equal(r.status, 0, r.out);
});

test("a long function, arrow or method fails, named with its file and line", () => {
  const r = check({
    "a.ts": `let x = 0;\nexport function longFn() {\n${body(11)}\n}\n`,
    "b.ts": `let x = 0;\nexport const longArrow = () => {\n${body(11)}\n};\nclass C {\n  longMethod() {\n${body(11)}\n  }\n}\n`,
  });
  assert.equal(r.status, 1, r.out);
  assert.match(r.out, /a\.ts:2 longFn: 11 lines/);
  assert.match(r.out, /b\.ts:2 longArrow/);
  assert.match(r.out, /b\.ts:\d+ longMethod/);
});

test("a `// long:` reason right above it lets it pass; an empty reason does not", () => {
  const ok = check({
    "a.ts": `let x = 0;\n/** Doc. */\n// long: one literal\nexport function f() {\n${body(11)}\n}\n// long: a table\nexport const g = () => {\n${body(11)}\n};\n`,
  });
  assert.equal(ok.status, 0, ok.out);
  const bare = check({ "a.ts": `let x = 0;\n// long:\nexport function f() {\n${body(11)}\n}\n` });
  assert.equal(bare.status, 1, bare.out);
});

test("--report lists and exits 0", () => {
  const r = check({ "a.ts": `let x = 0;\nexport function f() {\n${body(11)}\n}\n` }, "--report");
  assert.equal(r.status, 0);
  assert.match(r.out, /a\.ts:2 f: 11 lines/);
});
