#!/usr/bin/env node
// Entry point: TypeScript sources are loaded through tsx so that the package runs without a build step.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../src/cli/main.ts");
await main(process.argv);
