import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

const script = join(dirname(fileURLToPath(import.meta.url)), "../../scripts/check-cycles.mjs");
const dirs: string[] = [];
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A throwaway source tree: path (relative to the root) → file text. */
function tree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), "check-cycles-"));
  dirs.push(root);
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text);
  }
  return root;
}

function check(root: string): { status: number | null; out: string } {
  const res = spawnSync(process.execPath, [script, root], { cwd: root, encoding: "utf8" });
  return { status: res.status, out: res.stdout + res.stderr };
}

test("an acyclic tree passes", () => {
  const root = tree({
    "a.ts": 'import { b } from "./b.ts";\nexport const a = b;\n',
    "b.ts": 'import type { C } from "./lib/c.ts";\nexport const b: C = 1;\n',
    "lib/c.ts": "export type C = number;\n",
    // Comments and dynamic imports are not edges: neither closes a load-time cycle.
    "lib/d.ts":
      '/**\n * import { a } from "../a.ts";\n */\n// import "../a.ts";\nexport const d = () => import("../a.ts");\n',
    "router/r.ts": 'import type { Plane } from "../transport/types.ts";\nexport type R = Plane;\n',
    "transport/types.ts": "export type Plane = string;\n",
  });
  const { status, out } = check(root);
  assert.equal(status, 0, out);
  assert.match(out, /no import cycle/);
});

test("a cycle fails and is named file by file", () => {
  const root = tree({
    "a.ts": 'import { b } from "./b.ts";\nexport const a = () => b;\n',
    "b.ts": 'import {\n  c,\n} from "./sub/c.ts";\nexport const b = () => c;\n',
    "sub/c.ts": 'export { a as c } from "../a.ts";\n',
  });
  const { status, out } = check(root);
  assert.equal(status, 1, out);
  assert.match(out, /^import cycle: a\.ts -> b\.ts -> sub\/c\.ts -> a\.ts$/m);
});

test("a cycle made only of `import type` still fails, labelled type-only", () => {
  const root = tree({
    "x.ts": 'import type { Y } from "./y.ts";\nexport interface X { y: Y }\n',
    "y.ts": 'import { type X } from "./x.ts";\nexport interface Y { x?: X }\n',
  });
  const { status, out } = check(root);
  assert.equal(status, 1, out);
  assert.match(out, /^type-only import cycle: x\.ts -> y\.ts -> x\.ts$/m);
});

test("router/ importing a transport implementation fails; transport/types.ts is allowed", () => {
  const root = tree({
    "router/mixed.ts":
      'import type { Plane } from "../transport/types.ts";\nimport { push } from "../transport/push-body.ts";\nexport const m: Plane = push;\n',
    "transport/types.ts": "export type Plane = string;\n",
    "transport/push-body.ts": 'export const push = "p";\n',
  });
  const { status, out } = check(root);
  assert.equal(status, 1, out);
  assert.match(
    out,
    /router imports a transport implementation: router\/mixed\.ts -> transport\/push-body\.ts/,
  );
  assert.doesNotMatch(out, /-> transport\/types\.ts/);
});
