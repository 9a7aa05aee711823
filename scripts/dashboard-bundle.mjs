// The dashboard's browser bundle (web/dashboard → app.js + app.css, uPlot included): one set of
// esbuild options shared by scripts/build.mjs (writes dist/dashboard/ at `npm run build`) and the
// server (src/server/dashboard/assets.ts builds it in memory on first request when dist/dashboard/
// is missing or older than web/dashboard/). Nothing is fetched at run time: no CDN.
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "./dist-stamp.mjs";

export const DASHBOARD_SRC = join(ROOT, "web", "dashboard");
export const DASHBOARD_DIST = join(ROOT, "dist", "dashboard");

/** esbuild options; `outdir` is where a written build goes (in-memory builds name files from it). */
export function dashboardBuildOptions() {
  return {
    entryPoints: { app: join(DASHBOARD_SRC, "main.ts") },
    outdir: DASHBOARD_DIST,
    bundle: true,
    format: "iife",
    platform: "browser",
    target: "es2020",
    minify: true,
    legalComments: "inline",
    logLevel: "warning",
  };
}

/** Newest modification time (ms) of the dashboard's sources. */
export function dashboardSourcesMtime() {
  let newest = 0;
  for (const e of readdirSync(DASHBOARD_SRC, { withFileTypes: true }))
    if (e.isFile()) newest = Math.max(newest, statSync(join(DASHBOARD_SRC, e.name)).mtimeMs);
  return newest;
}
