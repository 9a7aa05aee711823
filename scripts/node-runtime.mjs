// The project needs Node.js 24 (package.json engines). A machine whose `node` is older (e.g. a
// distribution's Node 20) gets a project-local Node 24 in .node/ from scripts/install-node.sh;
// bin/infera.js, bin/infera-sim.js and scripts/run-tests.mjs call `ensureNode24` first, so that
// `npx infera …` and `npm test` re-run themselves under it instead of failing on the old one.
// Plain JavaScript that Node 20 can parse: it runs before any TypeScript is loaded.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const REQUIRED_MAJOR = 24;
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const LOCAL_NODE_DIR = join(ROOT, ".node");
export const LOCAL_NODE = join(LOCAL_NODE_DIR, "bin", "node");

export function nodeMajor(version = process.versions.node) {
  return Number(version.split(".")[0]);
}

/**
 * Returns normally when this process already runs on Node ≥ 24. Otherwise re-runs the same
 * script with the same arguments under .node/bin/node (one line on stderr says so), relays
 * SIGINT/SIGTERM/SIGHUP to it, and exits with its status: the caller never gets control back,
 * since the promise stays pending. Without .node/ it exits 1 saying what to run.
 *
 * @param {string} name what to call this program in the messages
 * @returns {Promise<void>}
 */
export function ensureNode24(name) {
  if (nodeMajor() >= REQUIRED_MAJOR) return Promise.resolve();
  if (!existsSync(LOCAL_NODE)) {
    process.stderr.write(
      `${name}: needs Node.js ${REQUIRED_MAJOR}+, this is ${process.version}. ` +
        "Run `bash scripts/install-node.sh` (a project-local Node 24 in .node/) or use a Node 24 " +
        "(nvm install 24), then `npm ci` under it. See README, Node.js versions.\n",
    );
    process.exit(1);
  }
  process.stderr.write(`${name}: Node ${process.version} is too old, re-running under ${LOCAL_NODE}\n`);
  const child = spawn(LOCAL_NODE, [...process.execArgv, ...process.argv.slice(1)], {
    stdio: "inherit",
    // Children that start `node` by name (npm, shells) get the same Node 24.
    env: { ...process.env, PATH: `${join(LOCAL_NODE_DIR, "bin")}${delimiter}${process.env.PATH ?? ""}` },
  });
  // Ctrl-C on a terminal reaches the child directly (same process group): relaying it too would
  // make it a second SIGINT, which e.g. `infera bench` takes as "stop now, write nothing".
  const interactive = process.stdin.isTTY || process.stdout.isTTY || process.stderr.isTTY;
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
    process.on(sig, () => {
      if (!(sig === "SIGINT" && interactive)) child.kill(sig);
    });
  }
  child.on("exit", (code, signal) => {
    if (signal) {
      // Die of the same signal, so a parent sees what the child saw.
      process.removeAllListeners(signal);
      process.kill(process.pid, signal);
    }
    process.exit(code ?? 1);
  });
  child.on("error", (e) => {
    process.stderr.write(`${name}: cannot start ${LOCAL_NODE}: ${e.message}\n`);
    process.exit(1);
  });
  return new Promise(() => {});
}
