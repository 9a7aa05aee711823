// Compiles src/ to dist/ with esbuild (one ESM bundle per entry, shared chunks, node_modules
// external, source maps), so bin/*.js can run plain JavaScript: one bundle to load instead of
// every source module, each type-stripped by Node at load (bin/infera.js runs the sources when
// dist/ is missing or stale).
// Run by `npm run build` and by npm's `prepare` (so `npm ci` builds it). dist/ is git-ignored.
// `--outdir DIR` builds elsewhere (tests), leaving dist/ alone.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { build } from "esbuild";
import { dashboardBuildOptions } from "./dashboard-bundle.mjs";
import { DIST, ROOT, STAMP, sourceFingerprint } from "./dist-stamp.mjs";

const SRC = join(ROOT, "src");
const at = process.argv.indexOf("--outdir");
const OUT = at > 0 && process.argv[at + 1] ? resolve(process.argv[at + 1]) : DIST;
// Taken before compiling: an edit made during the build leaves a stamp that no longer matches.
const sources = sourceFingerprint();

/**
 * Every chunk lands directly in dist/, so a module's own `import.meta.url` (used for paths next
 * to the sources: bin/infera-sim.js, the sim's profiles, createRequire) is rewritten to the URL
 * of its source file, computed from the chunk's location: dist/ → ../src/<file>.
 */
const sourceUrls = {
  name: "source-import-meta-url",
  setup(b) {
    b.onLoad({ filter: /\.ts$/ }, (args) => {
      let text = readFileSync(args.path, "utf8");
      if (text.includes("import.meta.url")) {
        const rel = relative(OUT, args.path).split("\\").join("/");
        text = text.replaceAll("import.meta.url", `new URL(${JSON.stringify(rel)}, import.meta.url).href`);
      }
      return { contents: text, loader: "ts" };
    });
  },
};

rmSync(OUT, { recursive: true, force: true });
mkdirSync(OUT, { recursive: true });
const started = Date.now();
/**
 * The server's body parser runs on worker threads from a module of its own, built here as
 * dist/body-parser-worker.js. src/server/body-parser-pool.ts finds it through this define,
 * relative to its own (rewritten, see above) `import.meta.url`: src/server/ → ../../dist/.
 */
const BODY_PARSER_WORKER = "body-parser-worker";

await build({
  entryPoints: {
    infera: join(SRC, "cli/main.ts"),
    "infera-sim": join(SRC, "engine/sim/main.ts"),
    [BODY_PARSER_WORKER]: join(SRC, "server/body-parser-worker.ts"),
  },
  define: {
    __BODY_PARSER_WORKER_FILE__: JSON.stringify(
      `${relative(join(SRC, "server"), OUT).split("\\").join("/")}/${BODY_PARSER_WORKER}.js`,
    ),
  },
  outdir: OUT,
  bundle: true,
  splitting: true,
  format: "esm",
  platform: "node",
  target: "node24",
  packages: "external",
  sourcemap: "linked",
  chunkNames: "chunk-[hash]",
  logLevel: "warning",
  plugins: [sourceUrls],
});
// The dashboard page's browser bundle (served by `infera server` at /dashboard/app.js, .css),
// always under dist/: not part of an --outdir build.
if (OUT === DIST) await build(dashboardBuildOptions());
writeFileSync(
  OUT === DIST ? STAMP : join(OUT, "build-stamp.json"),
  `${JSON.stringify({ sources, builtAt: new Date().toISOString() })}\n`,
);
process.stdout.write(`built in ${Date.now() - started} ms (${pathToFileURL(OUT).href})\n`);
