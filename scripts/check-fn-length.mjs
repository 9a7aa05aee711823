#!/usr/bin/env node
// Function length check, run by `npm run lint`: no function under the root (default `src`)
// longer than MAX lines (its body, first to last line) unless a `// long: <why>` comment sits
// on the line right above it (or above its variable/property, for an arrow or function
// expression) saying why it stays whole. Uses the TypeScript compiler's parser, so arrows,
// methods, accessors and constructors count as functions too; a nested function counts for
// itself and inside its parent.
// Usage: node scripts/check-fn-length.mjs [root] [--max N] [--report]
//   → exit 0 when clean, 1 with every finding listed; --report lists and exits 0.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative, sep } from "node:path";
import ts from "typescript";

const args = process.argv.slice(2);
const at = args.indexOf("--max");
const MAX = at >= 0 ? Number(args[at + 1]) : 100;
const reportOnly = args.includes("--report");
const root = args.find((a, i) => !a.startsWith("--") && args[i - 1] !== "--max") ?? "src";

function collect(dir, out) {
  for (const name of readdirSync(dir).sort()) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) {
      if (name !== "node_modules") collect(path, out);
    } else if (name.endsWith(".ts") && !name.endsWith(".d.ts")) out.push(path);
  }
  return out;
}

/** A readable name for a function node: its own, or its variable's / property's. */
function nameOf(node) {
  if (node.name && ts.isIdentifier(node.name)) return node.name.text;
  if (ts.isConstructorDeclaration(node)) return "constructor";
  const p = node.parent;
  if (p && (ts.isVariableDeclaration(p) || ts.isPropertyDeclaration(p) || ts.isPropertyAssignment(p)))
    return p.name.getText();
  return "(anonymous)";
}

/** The node whose line above may carry the `// long:` comment. */
function anchorOf(node) {
  const p = node.parent;
  if (p && ts.isVariableDeclaration(p)) return p.parent?.parent ?? p; // the `const` statement
  if (p && (ts.isPropertyDeclaration(p) || ts.isPropertyAssignment(p))) return p;
  return node;
}

function justified(sf, node) {
  const ranges = ts.getLeadingCommentRanges(sf.text, anchorOf(node).getFullStart()) ?? [];
  return ranges.some((r) => /^\/\/\s*long:\s*\S/.test(sf.text.slice(r.pos, r.end)));
}

const findings = [];
for (const file of collect(root, [])) {
  const sf = ts.createSourceFile(file, readFileSync(file, "utf8"), ts.ScriptTarget.Latest, true);
  const visit = (node) => {
    if (ts.isFunctionLike(node) && node.body) {
      const first = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
      const last = sf.getLineAndCharacterOfPosition(node.end).line;
      const lines = last - first + 1;
      if (lines > MAX && !justified(sf, node))
        findings.push(
          `${relative(process.cwd(), file).split(sep).join("/")}:${first + 1} ${nameOf(node)}: ${lines} lines`,
        );
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
}

if (findings.length === 0) {
  console.log(`check-fn-length: no function over ${MAX} lines under ${root} without a "// long:" reason`);
  process.exit(0);
}
console.log(`check-fn-length: ${findings.length} function(s) over ${MAX} lines without a "// long:" reason:`);
for (const f of findings) console.log(`  ${f}`);
process.exit(reportOnly ? 0 : 1);
