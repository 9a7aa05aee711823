#!/usr/bin/env node
// Entry point: runs the compiled dist/ (scripts/build.mjs, built by `npm ci` / `npm run build`)
// when it was built from the sources as they are now; otherwise the TypeScript sources, which
// Node 24 runs as they are (type stripping), so an edit under src/ never runs stale code.
// INFERA_DIST=0 forces the sources. Started by an older node (a machine's Node 20), it re-runs
// itself under the project-local Node 24 (scripts/install-node.sh).
import { ensureNode24 } from "../scripts/node-runtime.mjs";

await ensureNode24("infera");
const { chooseEntry } = await import("../scripts/dist-stamp.mjs");
let main;
if (chooseEntry() === "dist") {
  process.setSourceMapsEnabled(true);
  ({ main } = await import("../dist/infera.js"));
} else {
  ({ main } = await import("../src/cli/main.ts"));
}
await main(process.argv);
