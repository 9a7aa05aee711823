/**
 * Writes docs/plugins.md from the pipeline registry (src/router/pipeline/doc.ts):
 * `node scripts/gen-plugin-doc.ts`. With `--check` it writes nothing and exits 1 when the file
 * is stale (`npm run lint` runs it so); test/router/pipeline/doc.test.ts checks the same.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { renderPluginDoc } from "../src/router/pipeline/doc.ts";

const path = fileURLToPath(new URL("../docs/plugins.md", import.meta.url));
const want = renderPluginDoc();
if (process.argv.includes("--check")) {
  let have = "";
  try {
    have = readFileSync(path, "utf8");
  } catch {}
  if (have !== want) {
    console.error("docs/plugins.md is stale: run `node scripts/gen-plugin-doc.ts`");
    process.exit(1);
  }
} else {
  writeFileSync(path, want);
}
