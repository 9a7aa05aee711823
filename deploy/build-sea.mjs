#!/usr/bin/env node
// Builds a self-contained `infera` executable with Node's single-executable applications:
// esbuild bundles src/deploy/sea-entry.ts with its dependencies into one CommonJS file (SEA
// runs CommonJS, and its `require` reaches only built-in modules), `node
// --experimental-sea-config` turns it into a blob, and postject injects the blob into a copy
// of this node binary. Native addons (zeromq, koffi, usocket) cannot be bundled: they load from
// node_modules/ beside the executable (the image ships /infera/bin/node_modules), only when a
// command needs them (the KV-event relay, kvd's fd passing).
//
//   node deploy/build-sea.mjs [--with-natives] [out]   (default out: $TMPDIR/infera-sea/infera)
//
// --with-natives: also copy the native addons and everything they load at run time (their
// `dependencies` and installed `optionalDependencies`, transitively: zeromq needs cmake-ts's
// loader, usocket needs bindings, msgpackr-extract its platform package) into node_modules/
// beside the executable, as the image ships them in /infera/bin.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  chmodSync,
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const withNatives = args.includes("--with-natives");
const positional = args.filter((a) => !a.startsWith("--"));
const out = resolve(positional[0] ?? join(tmpdir(), "infera-sea", "infera"));
const work = dirname(out);
mkdirSync(work, { recursive: true });
const bundle = join(work, "infera-sea.cjs");
const NATIVE = ["zeromq", "koffi", "usocket", "msgpackr-extract", "cpu-features", "ssh2"];
/** Build tools and headers some addons list as dependencies; nothing requires them at run time. */
const BUILD_ONLY = new Set(["node-gyp", "nan", "node-addon-api"]);

/**
 * etcd3 loads its .proto files from `${__dirname}/../proto` when it is required; inside the
 * executable there is no such directory. Inline them and write them once to a temp directory.
 */
const etcd3Protos = {
  name: "etcd3-protos",
  setup(b) {
    b.onLoad({ filter: /etcd3[\\/]lib[\\/]connection-pool\.js$/ }, (args) => {
      const protoDir = join(dirname(args.path), "..", "proto");
      const files = Object.fromEntries(
        readdirSync(protoDir)
          .filter((f) => f.endsWith(".proto"))
          .map((f) => [f, readFileSync(join(protoDir, f), "utf8")]),
      );
      const tag = createHash("sha256").update(JSON.stringify(files)).digest("hex").slice(0, 12);
      const prelude =
        `const __inferaProtoDir = (() => { const fs = require("node:fs"), path = require("node:path"), os = require("node:os");` +
        ` const dir = path.join(os.tmpdir(), "infera-etcd3-proto-${tag}"); fs.mkdirSync(dir, { recursive: true });` +
        ` for (const [n, t] of Object.entries(${JSON.stringify(files)})) { const p = path.join(dir, n);` +
        ` if (!fs.existsSync(p)) fs.writeFileSync(p, t); } return dir; })();\n`;
      const text = readFileSync(args.path, "utf8");
      const patched = text.replace("`${__dirname}/../proto/rpc.proto`", "`${__inferaProtoDir}/rpc.proto`");
      if (patched === text) throw new Error("etcd3 connection-pool.js: proto path not found (etcd3 changed?)");
      return { contents: prelude + patched, loader: "js" };
    });
  },
};

/**
 * Native addons load from a node_modules/ directory next to the executable (the image copies
 * it along): SEA's own `require` reaches built-ins only, `createRequire` reaches the disk.
 */
const nativeBesideExe = {
  name: "native-beside-exe",
  setup(b) {
    const filter = new RegExp(`^(${NATIVE.join("|")})$`);
    b.onResolve({ filter }, (args) => ({ path: args.path, namespace: "native-beside-exe" }));
    b.onLoad({ filter: /.*/, namespace: "native-beside-exe" }, (args) => ({
      contents:
        `module.exports = require("node:module").createRequire(` +
        `require("node:path").join(require("node:path").dirname(process.execPath), "node_modules", "_"))(${JSON.stringify(args.path)});`,
      loader: "js",
    }));
  },
};

await build({
  plugins: [etcd3Protos, nativeBesideExe],
  entryPoints: [join(ROOT, "src/deploy/sea-entry.ts")],
  outfile: bundle,
  bundle: true,
  platform: "node",
  format: "cjs",
  target: "node24",
  // import.meta.url has no meaning in CommonJS; paths next to sources do not exist in the
  // executable either (the sim and its profiles are not shipped in it).
  define: { "import.meta.url": "__infera_sea_url" },
  banner: { js: 'const __infera_sea_url = require("node:url").pathToFileURL(process.execPath).href;' },
  logLevel: "warning",
});

const blob = join(work, "infera-sea.blob");
const config = join(work, "sea-config.json");
writeFileSync(
  config,
  JSON.stringify({ main: bundle, output: blob, disableExperimentalSEAWarning: true, useCodeCache: false }),
);
execFileSync(process.execPath, ["--experimental-sea-config", config], { stdio: "inherit" });
copyFileSync(process.execPath, out);
chmodSync(out, 0o755);
execFileSync(
  process.execPath,
  [
    join(ROOT, "node_modules/postject/dist/cli.js"),
    out,
    "NODE_SEA_BLOB",
    blob,
    "--sentinel-fuse",
    "NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2",
  ],
  { stdio: "inherit" },
);

/** The installed packages `names` need at run time, by their directory under node_modules/. */
function runtimeClosure(names) {
  const found = new Map();
  const visit = (name, fromDir) => {
    if (BUILD_ONLY.has(name)) return;
    // Node's lookup: the requiring package's own node_modules/, then the root's.
    const dir = [join(fromDir, "node_modules", name), join(ROOT, "node_modules", name)].find((d) =>
      existsSync(join(d, "package.json")),
    );
    if (!dir || found.has(dir)) return;
    found.set(dir, name);
    const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
    for (const dep of Object.keys({ ...pkg.dependencies, ...pkg.optionalDependencies })) visit(dep, dir);
  };
  for (const n of names) visit(n, ROOT);
  return [...found.keys()];
}

if (withNatives) {
  const nm = join(ROOT, "node_modules");
  for (const dir of runtimeClosure(NATIVE)) {
    const rel = dir.slice(nm.length + 1);
    cpSync(dir, join(work, "node_modules", rel), { recursive: true, dereference: false });
  }
}
process.stdout.write(`${out}\n`);
