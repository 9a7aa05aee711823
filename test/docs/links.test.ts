/**
 * The docs' links hold: every `docs/<file>.md#anchor` that a source, test or doc cites names a
 * file and an anchor that exist (an explicit `<a id>` or a heading's GitHub slug), and every
 * relative link in docs/*.md and the folder READMEs points at a file that exists. A file moved
 * or a section renamed without its citations fails here instead of leaving a dead pointer.
 */
import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

function walk(dir: string, keep: (p: string) => boolean, out: string[] = []): string[] {
  for (const name of readdirSync(dir)) {
    if (name === "node_modules" || name.startsWith(".")) continue;
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, keep, out);
    else if (keep(p)) out.push(p);
  }
  return out;
}

/** GitHub's heading slug: lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  return heading
    .toLowerCase()
    .replace(/[`*_]/g, "")
    .replace(/[^\p{L}\p{N} -]/gu, "")
    .replace(/ /g, "-");
}

function anchorsOf(file: string): Set<string> {
  const text = readFileSync(file, "utf8");
  const out = new Set<string>();
  for (const m of text.matchAll(/<a id="([^"]+)"><\/a>/g)) out.add(m[1]);
  for (const m of text.matchAll(/^#{1,6} (.+)$/gm)) out.add(slug(m[1].trim()));
  return out;
}

const sources = [
  ...walk(join(ROOT, "src"), (p) => /\.(ts|md)$/.test(p)),
  ...walk(join(ROOT, "test"), (p) => p.endsWith(".ts")),
  ...walk(join(ROOT, "docs"), (p) => p.endsWith(".md")),
  join(ROOT, "CONTRIBUTING.md"),
  join(ROOT, "README.md"),
].filter((f) => f !== fileURLToPath(import.meta.url));

describe("docs links", () => {
  it("every docs/<file>.md#anchor cited in src, test and docs exists", () => {
    const dead: string[] = [];
    const cache = new Map<string, Set<string>>();
    for (const file of sources) {
      const text = readFileSync(file, "utf8");
      // `docs/x.md#a` and the extra anchors of a list: `docs/x.md#a, #b`.
      for (const m of text.matchAll(/docs\/([\w-]+\.md)((?:#[\w-]+(?:, )?)+)/g)) {
        const doc = join(ROOT, "docs", m[1]);
        if (!existsSync(doc)) {
          dead.push(`${relative(ROOT, file)}: docs/${m[1]} (no such file)`);
          continue;
        }
        if (!cache.has(doc)) cache.set(doc, anchorsOf(doc));
        for (const a of m[2].split(/[#, ]+/).filter(Boolean)) {
          if (!cache.get(doc)?.has(a)) dead.push(`${relative(ROOT, file)}: docs/${m[1]}#${a}`);
        }
      }
    }
    assert.deepEqual(dead, []);
  });

  it("no citation of the old summary's sections (engine-protocols.md §N) is left", () => {
    const old = sources.filter((f) => /engine-protocols\.md §/.test(readFileSync(f, "utf8")));
    assert.deepEqual(
      old.map((f) => relative(ROOT, f)),
      [],
    );
  });

  it("every folder directly under src/ has a README that says what lives there and what it may import", () => {
    const missing: string[] = [];
    for (const name of readdirSync(join(ROOT, "src")).sort()) {
      const dir = join(ROOT, "src", name);
      if (!statSync(dir).isDirectory()) continue;
      const readme = join(dir, "README.md");
      const text = existsSync(readme) ? readFileSync(readme, "utf8") : "";
      if (!/^## What lives here/m.test(text) || !/may import/i.test(text)) missing.push(`src/${name}`);
    }
    assert.deepEqual(missing, []);
  });

  it("relative links in docs/*.md and folder READMEs point at files that exist", () => {
    const docs = sources.filter((f) => f.endsWith(".md"));
    const dead: string[] = [];
    for (const file of docs) {
      const text = readFileSync(file, "utf8")
        .replace(/```[\s\S]*?```/g, "")
        .replace(/`[^`\n]*`/g, "");
      for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = m[1].split("#")[0];
        if (target === "" || /^[a-z]+:/i.test(target)) continue;
        if (!existsSync(resolve(dirname(file), target))) dead.push(`${relative(ROOT, file)}: ${m[1]}`);
      }
    }
    assert.deepEqual(dead, []);
  });
});
