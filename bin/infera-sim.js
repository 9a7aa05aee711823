#!/usr/bin/env node
// The simulated engine as a stand-alone executable that takes vLLM's command line
// (`infera-sim serve MODEL --port 8000 ...`), so a launcher can start it in vLLM's place.
import { register } from "tsx/esm/api";

register();
const { simMain } = await import("../src/engine/sim/main.ts");
await simMain(process.argv.slice(2));
