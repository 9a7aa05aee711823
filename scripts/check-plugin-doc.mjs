#!/usr/bin/env node
// `npm run lint`'s docs/plugins.md check: runs scripts/gen-plugin-doc.ts --check under Node 24.
// The lint script starts under whatever `node` the shell has; a Node 20 cannot load a .ts file,
// so this plain-JavaScript step re-runs itself under the project's Node 24 first, as
// scripts/run-tests.mjs does (scripts/node-runtime.mjs).
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { ensureNode24 } from "./node-runtime.mjs";

await ensureNode24("check-plugin-doc");
const gen = fileURLToPath(new URL("./gen-plugin-doc.ts", import.meta.url));
const r = spawnSync(process.execPath, [gen, "--check"], { stdio: "inherit" });
process.exit(r.status ?? 1);
