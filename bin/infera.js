#!/usr/bin/env node
// Entry point: runs the compiled dist/ (scripts/build.mjs, built by `npm ci` / `npm run build`)
// when it was built from the sources as they are now; otherwise the TypeScript sources through
// tsx, so an edit under src/ never runs stale code. INFERA_DIST=0 forces the sources.
import { chooseEntry } from "../scripts/dist-stamp.mjs";

let main;
if (chooseEntry() === "dist") {
  process.setSourceMapsEnabled(true);
  ({ main } = await import("../dist/infera.js"));
} else {
  const { register } = await import("tsx/esm/api");
  register();
  ({ main } = await import("../src/cli/main.ts"));
}
await main(process.argv);
