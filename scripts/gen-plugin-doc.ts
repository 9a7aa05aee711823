/**
 * Writes docs/plugins.md, and the short plugin list in docs/architecture.md, from the pipeline
 * registry (src/router/pipeline/doc.ts): `node scripts/gen-plugin-doc.ts`. With `--check` it
 * writes nothing and exits 1 when either is stale (`npm run lint` runs it so);
 * test/router/pipeline/doc.test.ts checks the same.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { renderPluginDoc, renderPluginList } from "../src/router/pipeline/doc.ts";

const plugins = fileURLToPath(new URL("../docs/plugins.md", import.meta.url));
const arch = fileURLToPath(new URL("../docs/architecture.md", import.meta.url));

function read(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

const archNow = read(arch);
const want: [string, string, string][] = [
  [plugins, read(plugins), renderPluginDoc()],
  [arch, archNow, renderPluginList(archNow)],
];
const stale = want.filter(([, have, next]) => have !== next);
if (process.argv.includes("--check")) {
  for (const [path] of stale) console.error(`${path} is stale: run \`node scripts/gen-plugin-doc.ts\``);
  process.exit(stale.length > 0 ? 1 : 0);
}
for (const [path, , next] of stale) writeFileSync(path, next);
