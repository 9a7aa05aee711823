/**
 * What a route handler may read: the server's parts, built once by the wiring (./app.ts) and
 * handed to every handler of the route table (./routes.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AutoRouter } from "../router/auto.ts";
import type { DecisionLog } from "../router/pipeline/decisions.ts";
import type { WorkerSet } from "../router/worker-set.ts";
import type { Logger } from "../util/log.ts";
import type { ApiKeyAuth } from "./auth.ts";
import type { ServerConfig } from "./config.ts";
import type { DashboardRouteContext } from "./dashboard/routes.ts";
import type { KvIngest } from "./extension-api.ts";
import type { ServerMetrics } from "./metrics.ts";
import type { ProxyContext } from "./request-context.ts";

export interface RouteContext {
  config: ServerConfig;
  auth: ApiKeyAuth;
  workers: WorkerSet;
  router: AutoRouter;
  metrics: ServerMetrics;
  decisions: DecisionLog;
  kvIngest: KvIngest | null;
  /** What the completion handlers (./proxy.ts) read. */
  proxy: ProxyContext;
  dashboard: DashboardRouteContext;
  logger: Logger;
  /** Whether a drain has started (./lifecycle.ts). */
  draining(): boolean;
  /** /ready holds the server out while a rank's start-up KV replay runs, until this time (ms). */
  kvSyncWaitUntil: number;
}

/**
 * One route's handler. `query` is the URL's part after `?` ("" when none). It answers `res`
 * itself (a promise it starts answers its own errors); a synchronous throw (a failed auth check,
 * bad input) is answered as an OpenAI-shaped error by the dispatcher.
 */
export type RouteHandler = (
  ctx: RouteContext,
  req: IncomingMessage,
  res: ServerResponse,
  query: string,
) => void;
