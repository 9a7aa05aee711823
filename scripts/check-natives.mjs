#!/usr/bin/env node
// Loads each native dependency the way the code does and prints one line per addon; exits 1 if
// any fails. Their binaries are tied to the Node that installed them (usocket is compiled for its
// ABI; the others pick a Node-API prebuild), so a node_modules/ installed under another major
// fails here rather than in the middle of a kvd test. Run by scripts/postinstall.mjs and
// scripts/setup.sh; test/runtime/natives.test.ts checks the same under the test runner.
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
/** Each addon, and a call that reaches its native code (not just its JavaScript wrapper). */
const CHECKS = {
  zeromq: (m) => `libzmq ${m.version}`,
  koffi: (m) => `koffi ${m.version}, libc getpid() = ${m.load("libc.so.6").func("int getpid()")()}`,
  usocket: (m) => `USocket ${typeof m.USocket}`,
  "msgpackr-extract": (m) => `extractStrings ${typeof m.extractStrings}`,
};

let failed = 0;
for (const [name, probe] of Object.entries(CHECKS)) {
  try {
    process.stdout.write(`natives: ${name} ok (${probe(require(name))})\n`);
  } catch (e) {
    failed++;
    process.stdout.write(
      `natives: ${name} FAILED under Node ${process.version}: ${String(e.message).replace(/\s+/g, " ").slice(0, 400)}\n`,
    );
  }
}
if (failed > 0) {
  process.stdout.write(
    "natives: rebuild them under this Node: `npm rebuild zeromq koffi usocket msgpackr-extract`, with npm_config_nodedir set to its install dir if ~/.npmrc names another nodedir (README, Node.js versions)\n",
  );
  process.exit(1);
}
