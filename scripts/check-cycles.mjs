#!/usr/bin/env node
// Import-graph checks that biome does not do, run by `npm run lint`:
//  1. no import cycle among the .ts files under the root (default `src`), `import type` included:
//     a type-only cycle still ties two modules' contracts together, which is what we want to avoid;
//  2. the routers stay transport-agnostic: nothing under <root>/router/ imports a file under
//     <root>/transport/ except the contract module <root>/transport/types.ts.
// Only relative specifiers are followed (packages cannot close a cycle through our files), and only
// static `import`/`export … from` statements: a dynamic `import()` is a deliberate lazy edge.
// Usage: node scripts/check-cycles.mjs [root]   → exit 0 when clean, 1 with every finding listed.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";

const root = resolve(process.argv[2] ?? "src");
const rel = (file) => relative(process.cwd(), file).split(sep).join("/");

function collect(dir, out) {
  for (const name of readdirSync(dir).sort()) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) {
      if (name !== "node_modules") collect(path, out);
    } else if (name.endsWith(".ts") && !name.endsWith(".d.ts")) {
      out.push(path);
    }
  }
  return out;
}

// A statement starts a line (so JSDoc ` * import …` and `// import …` never match); the clause
// between the keyword and `from` may span lines (`import {\n a,\n b,\n} from "x"`).
const FROM_RE = /^[ \t]*(import|export)\s+(type\s+)?([^;"'`]*?)\s*from\s*["']([^"']+)["']/gm;
const BARE_RE = /^[ \t]*import\s*["']([^"']+)["']/gm;

/** Whether `import { type A, type B }` names types only (an `import type`-equivalent clause). */
function allTypeSpecifiers(clause) {
  const m = /^\{([\s\S]*)\}$/.exec(clause.trim());
  if (!m) return false;
  const names = m[1]
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  return names.length > 0 && names.every((n) => n.startsWith("type "));
}

function resolveSpecifier(from, spec) {
  const base = resolve(dirname(from), spec);
  const candidates = [base, base.replace(/\.js$/, ".ts"), `${base}.ts`, join(base, "index.ts")];
  return candidates.find((c) => c.endsWith(".ts") && existsSync(c) && statSync(c).isFile());
}

/** file → Map(target → { typeOnly }) for the relative imports that resolve to a .ts file. */
function buildGraph(files) {
  const graph = new Map();
  for (const file of files) {
    const text = readFileSync(file, "utf8");
    const edges = new Map();
    const add = (spec, typeOnly) => {
      if (!spec.startsWith(".")) return;
      const target = resolveSpecifier(file, spec);
      if (!target) return;
      const prev = edges.get(target);
      edges.set(target, { typeOnly: (prev ? prev.typeOnly : true) && typeOnly });
    };
    for (const m of text.matchAll(FROM_RE)) add(m[4], Boolean(m[2]) || allTypeSpecifiers(m[3]));
    for (const m of text.matchAll(BARE_RE)) add(m[1], false);
    graph.set(file, edges);
  }
  return graph;
}

/** Tarjan's strongly connected components; every component of 2+ files (or a self-import) is a cycle. */
function cyclicComponents(graph) {
  let next = 0;
  const index = new Map();
  const low = new Map();
  const stack = [];
  const onStack = new Set();
  const out = [];
  const visit = (v) => {
    index.set(v, next);
    low.set(v, next);
    next++;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v)?.keys() ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v), index.get(w)));
      }
    }
    if (low.get(v) === index.get(v)) {
      const comp = [];
      let w;
      do {
        w = stack.pop();
        onStack.delete(w);
        comp.push(w);
      } while (w !== v);
      if (comp.length > 1 || graph.get(v)?.has(v)) out.push(comp.sort());
    }
  };
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) visit(v);
  return out;
}

/** One shortest cycle through `start` inside its component, as a file list ending where it began. */
function cycleThrough(graph, comp, start) {
  const inComp = new Set(comp);
  const prev = new Map();
  const queue = [start];
  while (queue.length > 0) {
    const v = queue.shift();
    for (const w of [...(graph.get(v)?.keys() ?? [])].sort()) {
      if (!inComp.has(w)) continue;
      if (w === start) {
        const path = [v];
        while (path[0] !== start) path.unshift(prev.get(path[0]));
        return [...path, start];
      }
      if (!prev.has(w)) {
        prev.set(w, v);
        queue.push(w);
      }
    }
  }
  return [start, start];
}

const files = collect(root, []);
const graph = buildGraph(files);
const problems = [];

for (const comp of cyclicComponents(graph)) {
  const cycle = cycleThrough(graph, comp, comp[0]);
  const typeOnly = cycle.slice(1).every((to, i) => graph.get(cycle[i]).get(to).typeOnly);
  const kind = typeOnly ? "type-only import cycle" : "import cycle";
  const more =
    comp.length > cycle.length - 1 ? ` (component of ${comp.length} files: ${comp.map(rel).join(", ")})` : "";
  problems.push(`${kind}: ${cycle.map(rel).join(" -> ")}${more}`);
}

const routerDir = join(root, "router") + sep;
const transportDir = join(root, "transport") + sep;
const transportContract = join(root, "transport", "types.ts");
for (const [file, edges] of graph) {
  if (!file.startsWith(routerDir)) continue;
  for (const target of edges.keys()) {
    if (target.startsWith(transportDir) && target !== transportContract) {
      problems.push(`router imports a transport implementation: ${rel(file)} -> ${rel(target)}`);
    }
  }
}

if (problems.length > 0) {
  for (const p of problems) console.error(p);
  console.error(
    `check-cycles: ${problems.length} problem(s) in ${files.length} files under ${rel(root) || "."}`,
  );
  process.exit(1);
}
console.log(`check-cycles: ${files.length} files under ${rel(root) || "."}, no import cycle`);
