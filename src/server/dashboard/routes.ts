/**
 * The dashboard's routes: GET /dashboard (the page), /dashboard/state (the JSON snapshot the
 * page polls and the tests read), /dashboard/app.js and /dashboard/app.css (the browser bundle).
 *
 * Auth: with API keys set, the page and the state need a key, in `Authorization: Bearer` (or
 * x-api-key) like every other route, or as `?key=` on the page URL, since a browser address bar
 * cannot send a header; the page then drops it from its address and sends it as a Bearer
 * header on its polls, and a session cookie (checkAuth) covers a reload. The bundle holds
 * only code (no state), so it is public, as a page's script tag cannot send the header either.
 *
 * The bundle: dist/dashboard/ when `npm run build` made it (and it is newer than web/dashboard/);
 * otherwise (running from the sources) built in memory with esbuild on the first request.
 */
import { readFile, stat } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { join } from "node:path";
import { build } from "esbuild";
import {
  DASHBOARD_DIST,
  dashboardBuildOptions,
  dashboardSourcesMtime,
} from "../../../scripts/dashboard-bundle.mjs";
import type { ApiKeyAuth } from "../auth.ts";
import { sendError, sendJson } from "../http-util.ts";
import type { DashboardState } from "./state.ts";

export const DASHBOARD_PATHS = ["/dashboard", "/dashboard/state", "/dashboard/app.js", "/dashboard/app.css"];

interface Bundle {
  js: Buffer;
  css: Buffer;
  /** Where it came from: "dist" or "memory". */
  from: "dist" | "memory";
}

let bundle: Promise<Bundle> | null = null;

async function loadBundle(): Promise<Bundle> {
  const jsPath = join(DASHBOARD_DIST, "app.js");
  const cssPath = join(DASHBOARD_DIST, "app.css");
  try {
    const [js, css] = await Promise.all([stat(jsPath), stat(cssPath)]);
    let srcMtime = 0;
    try {
      srcMtime = dashboardSourcesMtime();
    } catch {
      // No web/dashboard/ (an installed copy without sources): the built bundle is all there is.
    }
    if (Math.min(js.mtimeMs, css.mtimeMs) >= srcMtime)
      return { js: await readFile(jsPath), css: await readFile(cssPath), from: "dist" };
  } catch {
    // Not built: build it below.
  }
  const out = await build({ ...dashboardBuildOptions(), write: false });
  const pick = (ext: string): Buffer => {
    const f = out.outputFiles.find((o) => o.path.endsWith(ext));
    return f ? Buffer.from(f.contents) : Buffer.alloc(0);
  };
  return { js: pick(".js"), css: pick(".css"), from: "memory" };
}

/** The bundle, loaded or built once per process (a failed build is retried on the next request). */
export function dashboardBundle(): Promise<Bundle> {
  bundle ??= loadBundle().catch((err: unknown) => {
    bundle = null;
    throw err;
  });
  return bundle;
}

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Infera dashboard</title>
<link rel="stylesheet" href="/dashboard/app.css">
</head>
<body>
<header><h1>Infera</h1><span id="status">connecting…</span></header>
<main id="app"></main>
<script src="/dashboard/app.js"></script>
</body>
</html>
`;

const SECURITY_HEADERS: ReadonlyArray<[string, string]> = [
  ["content-security-policy", "frame-ancestors 'none'"],
  ["x-frame-options", "DENY"],
  ["referrer-policy", "no-referrer"],
];

export interface DashboardRouteContext {
  auth: ApiKeyAuth;
  state: DashboardState;
}

const SESSION_COOKIE = "infera_dashboard";

function sessionCookie(req: IncomingMessage): string | undefined {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const i = part.indexOf("=");
    if (i > 0 && part.slice(0, i).trim() === SESSION_COOKIE) return part.slice(i + 1).trim();
  }
  return undefined;
}

/**
 * A header key as on every route; else `?key=` on the page's address (a browser cannot send a
 * header there), which also sets a session cookie (`HttpOnly; SameSite=Strict`, an HMAC, not
 * the key) so the page can drop the key from its URL and still poll and reload; else that cookie.
 */
function checkAuth(
  auth: ApiKeyAuth,
  req: IncomingMessage,
  params: URLSearchParams,
  res?: ServerResponse,
): void {
  if (!auth.enabled) return;
  if (req.headers.authorization !== undefined || req.headers["x-api-key"] !== undefined) {
    auth.check(req.headers);
    return;
  }
  const key = params.get("key");
  if (key) {
    auth.check({ authorization: `Bearer ${key}` });
    res?.setHeader(
      "set-cookie",
      `${SESSION_COOKIE}=${auth.sessionFor(key)}; Path=/dashboard; HttpOnly; SameSite=Strict`,
    );
    return;
  }
  const session = sessionCookie(req);
  if (session !== undefined && auth.checkSession(session)) return;
  auth.check(req.headers);
}

/** Answers a GET/HEAD under /dashboard; false when `path` is not one of its routes. */
export function handleDashboard(
  ctx: DashboardRouteContext,
  path: string,
  query: string,
  req: IncomingMessage,
  res: ServerResponse,
): boolean {
  if (!DASHBOARD_PATHS.includes(path)) return false;
  // On every dashboard answer, errors included (issue #30 item 9): not framable (clickjacking),
  // and the page's `?key=` never leaves in a Referer. nosniff is set on every answer by app.ts.
  for (const [h, v] of SECURITY_HEADERS) res.setHeader(h, v);
  const params = new URLSearchParams(query);
  switch (path) {
    case "/dashboard":
      checkAuth(ctx.auth, req, params, res);
      res.writeHead(200, {
        "content-type": "text/html; charset=utf-8",
        "cache-control": "no-store",
        // Everything comes from this server; nothing may be loaded from elsewhere.
        "content-security-policy":
          "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
      });
      res.end(PAGE);
      return true;
    case "/dashboard/state": {
      checkAuth(ctx.auth, req, params);
      const n = Number(params.get("limit"));
      const limit = Number.isInteger(n) && n > 0 ? Math.min(n, 1000) : undefined;
      ctx.state.snapshot({ limit, model: params.get("model") ?? undefined }).then(
        (s) => sendJson(res, 200, s, { "cache-control": "no-store" }),
        (err) => sendError(res, err),
      );
      return true;
    }
    default: {
      const css = path.endsWith(".css");
      dashboardBundle().then(
        (b) => {
          res.writeHead(200, {
            "content-type": css ? "text/css; charset=utf-8" : "text/javascript; charset=utf-8",
            "cache-control": "no-cache",
            "x-infera-bundle": b.from,
          });
          res.end(css ? b.css : b.js);
        },
        (err) => sendError(res, err),
      );
      return true;
    }
  }
}
