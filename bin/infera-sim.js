#!/usr/bin/env node
// The simulated engine as a stand-alone executable that takes an engine's own command line:
// `infera-sim [--engine vllm|sglang|atom] <the args the real engine gets>` (vLLM by default:
// `infera-sim serve MODEL --port 8000 ...`), so a launcher can start it in the engine's place.
// Runs dist/ when it matches the sources, else the sources natively (see bin/infera.js).
import { ensureNode24 } from "../scripts/node-runtime.mjs";

await ensureNode24("infera-sim");
const { chooseEntry } = await import("../scripts/dist-stamp.mjs");
let simMain;
if (chooseEntry() === "dist") {
  process.setSourceMapsEnabled(true);
  ({ simMain } = await import("../dist/infera-sim.js"));
} else {
  ({ simMain } = await import("../src/engine/sim/main.ts"));
}
await simMain(process.argv.slice(2));
