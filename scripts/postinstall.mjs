#!/usr/bin/env node
// npm's `postinstall` for this package (after `npm ci` has installed and built the dependencies).
// Under Node 24+ it checks that the native addons load (rebuilding them against this Node's
// headers if not). Under an older node — `npm ci` typed in a shell whose node is a machine's
// Node 20 — it fetches the project-local Node 24
// (scripts/install-node.sh → .node/) and rebuilds the native addons under it with its headers:
// usocket compiles against the running Node's ABI, so the build npm just made for Node 20 would
// not load in the Node 24 that bin/infera.js and scripts/run-tests.mjs re-run themselves under.
// Plain JavaScript that Node 20 can parse.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { LOCAL_NODE, LOCAL_NODE_DIR, nodeMajor, REQUIRED_MAJOR } from "./node-runtime.mjs";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const NATIVES = ["usocket", "zeromq", "koffi", "msgpackr-extract"];
const checkNatives = join(ROOT, "scripts", "check-natives.mjs");

function run(cmd, args, env = process.env, { exitOnFailure = true } = {}) {
  const r = spawnSync(cmd, args, { cwd: ROOT, stdio: "inherit", env });
  if (r.status !== 0 && exitOnFailure) process.exit(r.status ?? 1);
  return r.status === 0;
}

if (nodeMajor() >= REQUIRED_MAJOR) {
  if (!run(process.execPath, [checkNatives], process.env, { exitOnFailure: false })) {
    // Typically a machine-wide `nodedir` (e.g. ~/.npmrc's /usr of a distribution's Node 20)
    // made node-gyp build usocket against another Node's headers: rebuild against this one's,
    // which official builds (nvm, nodejs.org, .node/) ship beside the binary.
    const own = resolve(dirname(process.execPath), "..");
    if (!existsSync(join(own, "include", "node", "common.gypi"))) process.exit(1);
    process.stderr.write(`postinstall: rebuilding the native addons against ${own}'s headers\n`);
    const env = { ...process.env, npm_config_nodedir: own };
    const npm = process.env.npm_execpath;
    if (npm) run(process.execPath, [npm, "rebuild", ...NATIVES], env);
    else run("npm", ["rebuild", ...NATIVES], env);
    run(process.execPath, [checkNatives], env);
  }
} else {
  process.stderr.write(
    `postinstall: npm ran on Node ${process.version}; the project runs on Node ${REQUIRED_MAJOR}: ` +
      "fetching a project-local one and rebuilding the native addons under it\n",
  );
  run("bash", [join(ROOT, "scripts", "install-node.sh")]);
  const env = {
    ...process.env,
    PATH: `${join(LOCAL_NODE_DIR, "bin")}${delimiter}${process.env.PATH ?? ""}`,
    // node-gyp builds against these headers, not a machine-wide nodedir (e.g. Node 20's /usr).
    npm_config_nodedir: LOCAL_NODE_DIR,
  };
  // npm_execpath: the npm that runs this script (npm-cli.js), run this time by Node 24.
  const npm = process.env.npm_execpath;
  if (npm) run(LOCAL_NODE, [npm, "rebuild", ...NATIVES], env);
  else run("npm", ["rebuild", ...NATIVES], env);
  run(LOCAL_NODE, [checkNatives], env);
}
