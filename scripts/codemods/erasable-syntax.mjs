#!/usr/bin/env node
// Rewrites the TypeScript syntax that Node 24's type stripping cannot erase (tsconfig's
// `erasableSyntaxOnly`) into syntax it can, so that node runs src/, test/, bench/ and scripts/
// without tsx:
//   - parameter properties, `constructor(private readonly x: T)`, become a field declaration at
//     the top of the class body plus `this.x = x;` right after the constructor's root `super(...)`
//     call (or first in its body) — the same order TypeScript emits for target ES2022
//     (useDefineForClassFields), so the behaviour does not change;
//   - angle-bracket assertions, `<T>x`, become `(x as T)`.
// Enums, instantiated namespaces, `import x = require(...)` and `export =` have no mechanical
// rewrite that keeps every use site valid: they are listed and the run exits 1.
// Idempotent: a second run finds nothing to do. Formats the files it changed with biome.
//
//   node scripts/codemods/erasable-syntax.mjs [--check] [--no-format] [paths…]   (default: src test bench scripts)
//   --check   change nothing; list what would change and exit 1 if anything would
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const ROOT = resolve(fileURLToPath(new URL("../..", import.meta.url)));
const args = process.argv.slice(2);
const check = args.includes("--check");
const format = !args.includes("--no-format");
const roots = args.filter((a) => !a.startsWith("--"));
const paths = (roots.length > 0 ? roots : ["src", "test", "bench", "scripts"]).map((p) => resolve(p));

function collect(path, out) {
  if (!existsSync(path)) return out;
  const st = statSync(path);
  if (st.isFile()) {
    if (/\.(ts|mts|cts)$/.test(path) && !/\.d\.[mc]?ts$/.test(path)) out.push(path);
    return out;
  }
  for (const name of readdirSync(path).sort()) {
    if (name === "node_modules" || name.startsWith(".")) continue;
    collect(join(path, name), out);
  }
  return out;
}

const PROPERTY_MODIFIERS = new Set([
  ts.SyntaxKind.PublicKeyword,
  ts.SyntaxKind.PrivateKeyword,
  ts.SyntaxKind.ProtectedKeyword,
  ts.SyntaxKind.ReadonlyKeyword,
  ts.SyntaxKind.OverrideKeyword,
]);

function isParameterProperty(p) {
  return (p.modifiers ?? []).some((m) => PROPERTY_MODIFIERS.has(m.kind));
}

/** The indentation of the line that `pos` is on. */
function indentAt(text, pos) {
  const lineStart = text.lastIndexOf("\n", pos - 1) + 1;
  return /^[ \t]*/.exec(text.slice(lineStart))[0];
}

/** @returns {{ edits: {start:number,end:number,text:string}[], unsupported: string[] }} */
function planFile(file, text) {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const edits = [];
  const unsupported = [];
  const where = (node) => {
    const { line, character } = sf.getLineAndCharacterOfPosition(node.getStart(sf));
    return `${relative(ROOT, file)}:${line + 1}:${character + 1}`;
  };

  const rewriteConstructor = (cls, ctor) => {
    const props = ctor.parameters.filter(isParameterProperty);
    if (props.length === 0 || !ctor.body) return;
    const memberIndent = indentAt(text, ctor.getStart(sf));
    const fields = [];
    const assigns = [];
    for (const p of props) {
      if (!ts.isIdentifier(p.name)) {
        unsupported.push(`${where(p)}: parameter property with a destructuring pattern`);
        continue;
      }
      const name = p.name.text;
      // Leading comments (a JSDoc) describe the property: they move with it.
      const comments = ts.getLeadingCommentRanges(text, p.pos) ?? [];
      const doc = comments.map((c) => `${memberIndent}${text.slice(c.pos, c.end).trim()}\n`).join("");
      const mods = p.modifiers
        .filter((m) => PROPERTY_MODIFIERS.has(m.kind))
        .map((m) => m.getText(sf))
        .join(" ");
      const type = p.type ? `: ${p.type.getText(sf)}` : "";
      fields.push(`${doc}${memberIndent}${mods} ${name}${p.questionToken ? "?" : ""}${type};\n`);
      assigns.push(`this.${name} = ${name};`);
      // Drop the comments and the property modifiers from the parameter; keep any others.
      const cut = comments.length > 0 ? comments[0].pos : p.getStart(sf);
      const keep = p.modifiers.filter((m) => !PROPERTY_MODIFIERS.has(m.kind)).map((m) => `${m.getText(sf)} `);
      edits.push({ start: cut, end: p.name.getStart(sf), text: keep.join("") });
    }
    if (fields.length === 0) return;
    // Declarations first in the class body, where TypeScript's ES2022 emit defines them.
    const open = cls.members.pos; // just after `{`
    edits.push({ start: open, end: open, text: `\n${fields.join("").replace(/\n$/, "")}` });
    const superCall = ctor.body.statements.find(
      (s) =>
        ts.isExpressionStatement(s) &&
        ts.isCallExpression(s.expression) &&
        s.expression.expression.kind === ts.SyntaxKind.SuperKeyword,
    );
    const bodyIndent = ctor.body.statements[0]
      ? indentAt(text, ctor.body.statements[0].getStart(sf))
      : `${memberIndent}  `;
    const at = superCall ? superCall.getEnd() : ctor.body.getStart(sf) + 1;
    edits.push({ start: at, end: at, text: assigns.map((a) => `\n${bodyIndent}${a}`).join("") });
  };

  const visit = (node) => {
    if (ts.isClassLike(node)) {
      for (const m of node.members) if (ts.isConstructorDeclaration(m)) rewriteConstructor(node, m);
    } else if (ts.isTypeAssertionExpression(node)) {
      // `<T>x` → `(x as T)`. The closing part is planned after the operand's own rewrites, so
      // that `<A><B>x` closes inner first: `((x as B) as A)`.
      edits.push({ start: node.getStart(sf), end: node.expression.getStart(sf), text: "(" });
      ts.forEachChild(node, visit);
      edits.push({ start: node.getEnd(), end: node.getEnd(), text: ` as ${node.type.getText(sf)})` });
      return;
    } else if (
      ts.isEnumDeclaration(node) &&
      !node.modifiers?.some((m) => m.kind === ts.SyntaxKind.DeclareKeyword)
    ) {
      unsupported.push(`${where(node)}: enum ${node.name.text} (use a const object and a union type)`);
    } else if (
      ts.isModuleDeclaration(node) &&
      !node.modifiers?.some((m) => m.kind === ts.SyntaxKind.DeclareKeyword) &&
      node.body &&
      ts.isModuleBlock(node.body) &&
      node.body.statements.some((s) => !ts.isInterfaceDeclaration(s) && !ts.isTypeAliasDeclaration(s))
    ) {
      unsupported.push(`${where(node)}: namespace ${node.name.getText(sf)} with runtime code (use a module)`);
    } else if (ts.isImportEqualsDeclaration(node) && !node.isTypeOnly) {
      unsupported.push(`${where(node)}: import = (use import / createRequire)`);
    } else if (ts.isExportAssignment(node) && node.isExportEquals) {
      unsupported.push(`${where(node)}: export = (use export default)`);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return { edits, unsupported };
}

function apply(text, edits) {
  // Insertions at one position keep their planned order; otherwise apply from the end.
  const sorted = edits.map((e, i) => ({ ...e, i })).sort((a, b) => b.start - a.start || b.i - a.i);
  let out = text;
  for (const e of sorted) out = out.slice(0, e.start) + e.text + out.slice(e.end);
  return out;
}

const changed = [];
const unsupported = [];
for (const file of paths.flatMap((p) => collect(p, []))) {
  const text = readFileSync(file, "utf8");
  const plan = planFile(file, text);
  unsupported.push(...plan.unsupported);
  if (plan.edits.length === 0) continue;
  changed.push(relative(ROOT, file));
  if (!check) writeFileSync(file, apply(text, plan.edits));
}

for (const f of changed) process.stdout.write(`${check ? "would rewrite" : "rewrote"} ${f}\n`);
for (const u of unsupported) process.stdout.write(`not erasable, rewrite by hand: ${u}\n`);
if (!check && format && changed.length > 0) {
  const biome = join(ROOT, "node_modules", "@biomejs", "biome", "bin", "biome");
  const r = spawnSync(process.execPath, [biome, "check", "--write", ...changed], {
    cwd: ROOT,
    stdio: "inherit",
  });
  if (r.status !== 0) process.stdout.write("biome check --write reported problems in the rewritten files\n");
}
process.stdout.write(`erasable-syntax: ${changed.length} file(s) ${check ? "to rewrite" : "rewritten"}\n`);
process.exit(unsupported.length > 0 || (check && changed.length > 0) ? 1 : 0);
