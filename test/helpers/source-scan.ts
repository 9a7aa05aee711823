/** Source lines matching a pattern, for the tests that forbid a kind of line in src/ (no-name-checks). */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

function* tsFiles(dir: string, skip: ReadonlySet<string>): Generator<string> {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) {
      if (!skip.has(e.name)) yield* tsFiles(p, skip);
    } else if (p.endsWith(".ts")) yield p;
  }
}

/** `file:line: text` for each line of a .ts file under `root` matching `re` (folders named in `skip` left out). */
export function matchingLines(root: string, re: RegExp, skip: readonly string[] = []): string[] {
  const hits: string[] = [];
  for (const f of tsFiles(root, new Set(skip)))
    readFileSync(f, "utf8")
      .split("\n")
      .forEach((line, i) => {
        if (re.test(line)) hits.push(`${f.slice(root.length)}:${i + 1}: ${line.trim()}`);
      });
  return hits;
}
