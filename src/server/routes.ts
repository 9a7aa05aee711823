/**
 * The route table: method + path → handler, one line per route. A new endpoint is one line here
 * and a handler file (a `RouteHandler`, ./route-context.ts). GET routes answer HEAD too. The
 * dispatcher answers 405 for a known path asked with another method, 404 for any other path, and
 * hands `/dashboard*` to the dashboard's own routes first.
 *
 * Every POST is work: the dispatcher refuses it while draining and counts it until its response
 * closes (./lifecycle.ts), before the table is looked at. Anything that must run before every
 * POST handler (an admission queue) goes in `dispatchPost`, one line.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { echoInput, InferaError, NotFoundError } from "../protocol/errors.ts";
import type { EndpointKind } from "../transport/types.ts";
import { messagesTranslation } from "./api/messages.ts";
import { handlePassthrough } from "./api/passthrough.ts";
import { responsesTranslation } from "./api/responses.ts";
import { handleTranslated, type Translation } from "./api/translated.ts";
import { DASHBOARD_PATHS, handleDashboard } from "./dashboard/routes.ts";
import { sendError } from "./http-util.ts";
import type { RequestTracker } from "./lifecycle.ts";
import { handleCompletion } from "./proxy.ts";
import type { RouteContext, RouteHandler } from "./route-context.ts";
import * as status from "./status-routes.ts";

export interface Route {
  method: "GET" | "POST";
  path: string;
  handler: RouteHandler;
  /**
   * Served by the raw front (./front/front.ts) when the request is plain: the handler must use
   * only the part of node:http's request and response that ./front/exchange.ts provides.
   */
  hot?: true;
}

/** Translated APIs (./api/translated.ts); the handler answers its own errors. */
const translated =
  (t: Translation): RouteHandler =>
  (c, req, res) =>
    void handleTranslated(c.proxy, t, req, res);

/** Pass-through routes (./api/passthrough.ts); the handler answers its own errors. */
const pass =
  (kind: EndpointKind): RouteHandler =>
  (c, req, res) =>
    void handlePassthrough(c.proxy, c.workers, kind, req, res);

/** The OpenAI completion endpoints (./proxy.ts); the handler answers its own errors. */
const completions =
  (kind: "chat" | "completion"): RouteHandler =>
  (c, req, res) =>
    void handleCompletion(c.proxy, kind, req, res);

export const ROUTES: readonly Route[] = [
  { method: "POST", path: "/v1/chat/completions", handler: completions("chat"), hot: true },
  { method: "POST", path: "/v1/completions", handler: completions("completion"), hot: true },
  { method: "POST", path: "/v1/responses", handler: translated(responsesTranslation), hot: true },
  { method: "POST", path: "/v1/messages", handler: translated(messagesTranslation), hot: true },
  { method: "POST", path: "/v1/embeddings", handler: pass("embeddings"), hot: true },
  { method: "POST", path: "/v1/rerank", handler: pass("rerank"), hot: true },
  { method: "POST", path: "/v1/score", handler: pass("score"), hot: true },
  { method: "POST", path: "/tokenize", handler: pass("tokenize"), hot: true },
  { method: "POST", path: "/detokenize", handler: pass("detokenize"), hot: true },
  { method: "GET", path: "/health", handler: status.health, hot: true },
  { method: "GET", path: "/ready", handler: status.ready, hot: true },
  { method: "GET", path: "/metrics", handler: status.metrics, hot: true },
  { method: "GET", path: "/v1/models", handler: status.models, hot: true },
  { method: "GET", path: "/v1/workers", handler: status.workers, hot: true },
  { method: "GET", path: "/debug/decisions", handler: status.decisions, hot: true },
];

/** path → method → handler, and every path the server knows (for 405 vs 404). */
const byPath = new Map<string, Map<string, RouteHandler>>();
for (const r of ROUTES) {
  const m = byPath.get(r.path) ?? new Map<string, RouteHandler>();
  byPath.set(r.path, m);
  m.set(r.method, r.handler);
}
const KNOWN = new Set([...byPath.keys(), ...DASHBOARD_PATHS]);
const hotPaths = (method: string) =>
  new Set(ROUTES.filter((r) => r.hot && r.method === method).map((r) => r.path));
const HOT_POST = hotPaths("POST");
const HOT_GET = hotPaths("GET");

/**
 * Whether the raw front may serve a plain `method` request to `path`: every route of the table
 * (the dashboard's and the model-card prefix route are node:http's). The status routes are
 * there too: a client's pool that sends a GET on a kept-alive connection would otherwise move
 * that connection to node:http for good.
 */
export const isHotPath = (method: string, path: string): boolean =>
  method === "POST" ? HOT_POST.has(path) : method === "GET" && HOT_GET.has(path);

/** The request listener: one per server, no closure per request. */
export function createDispatcher(
  ctx: RouteContext,
  tracker: RequestTracker,
): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    req.on("error", () => {});
    res.on("error", () => {});
    // Browsers must take every answer as the content type it declares (issue #30 item 9).
    res.setHeader("x-content-type-options", "nosniff");
    tracker.onRequest(res);
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const path = q < 0 ? url : url.slice(0, q);
    const query = q < 0 ? "" : url.slice(q + 1);
    const method = req.method;
    try {
      if (method === "POST") {
        if (dispatchPost(ctx, tracker, path, req, res, query)) return;
      } else if (method === "GET" || method === "HEAD") {
        if (path.startsWith("/dashboard") && handleDashboard(ctx.dashboard, path, query, req, res)) return;
        const h = byPath.get(path)?.get("GET");
        if (h) return h(ctx, req, res, query);
        if (path.startsWith(status.MODEL_CARD_PREFIX)) return status.model(ctx, req, res, query);
      }
      if (KNOWN.has(path)) {
        throw new InferaError(405, `Method ${echoInput(method ?? "")} is not allowed on ${path}.`, {
          code: "method_not_allowed",
        });
      }
      throw new NotFoundError(`No route for ${echoInput(method ?? "")} ${echoInput(path)}.`, "not_found");
    } catch (err) {
      req.resume();
      sendError(res, err, undefined, ctx.logger);
    }
  };
}

/** A POST: admitted (refused while draining, counted), then its route's handler, if any. */
function dispatchPost(
  ctx: RouteContext,
  tracker: RequestTracker,
  path: string,
  req: IncomingMessage,
  res: ServerResponse,
  query: string,
): boolean {
  tracker.admitPost(res);
  const h = byPath.get(path)?.get("POST");
  if (!h) return false;
  h(ctx, req, res, query);
  return true;
}
