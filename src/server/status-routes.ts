/**
 * The GET handlers that report on the server: liveness, readiness, Prometheus metrics, the
 * model and worker lists, and the last routing decisions. Listed in the route table
 * (./routes.ts).
 */
import type { WorkerRecord } from "../discovery/types.ts";
import { BadRequestError, echoInput, NotFoundError } from "../protocol/errors.ts";
import type { DecisionLog } from "../router/pipeline/decisions.ts";
import type { WorkerSet } from "../router/worker-set.ts";
import { maskUrlsDeep } from "../util/mask.ts";
import { sendError, sendJson } from "./http-util.ts";
import type { RouteHandler } from "./route-context.ts";

export const health: RouteHandler = (_ctx, _req, res) => {
  sendJson(res, 200, { status: "ok" });
};

export const ready: RouteHandler = (ctx, _req, res) => {
  if (ctx.draining()) {
    sendJson(res, 503, { ready: false, draining: true }, { connection: "close" });
    return;
  }
  const live = ctx.workers.list().filter((w) => w.available).length;
  // Counts only: which worker is where is on /dashboard/state, behind the key.
  const kv = ctx.kvIngest?.syncReport?.();
  const holding = kv !== undefined && kv.syncing > 0 && performance.now() < ctx.kvSyncWaitUntil;
  const isReady = live > 0 && !holding;
  const kvIndex = kv
    ? { synced: kv.synced, syncing: kv.syncing, unknown: kv.unknown, waiting: holding }
    : undefined;
  sendJson(res, isReady ? 200 : 503, { ready: isReady, workers: live, ...(kvIndex ? { kvIndex } : {}) });
};

export const metrics: RouteHandler = (ctx, req, res) => {
  // It lists every worker's address: behind the API key unless made public.
  if (!ctx.config.metricsPublic) ctx.auth.check(req.headers);
  ctx.metrics.text().then(
    (text) => {
      res.writeHead(200, { "content-type": ctx.metrics.registry.contentType });
      res.end(text);
    },
    (err) => sendError(res, err, undefined, ctx.logger),
  );
};

export const models: RouteHandler = (ctx, req, res) => {
  ctx.auth.check(req.headers);
  sendJson(res, 200, modelList(ctx.workers));
};

export const workers: RouteHandler = (ctx, req, res) => {
  ctx.auth.check(req.headers);
  sendJson(res, 200, workerList(ctx));
};

export const decisions: RouteHandler = (ctx, req, res, query) => {
  // Worker ids, loads and prompts' cache state: behind the API key like /v1/workers.
  ctx.auth.check(req.headers);
  sendJson(res, 200, decisionList(ctx.decisions, query));
};

/** The path prefix of `GET /v1/models/{id}` (the dispatcher's one prefix route). */
export const MODEL_CARD_PREFIX = "/v1/models/";

/**
 * `GET /v1/models/{id}`: the card of one served name (it may contain `/`), or 404
 * `model_not_found` as SGLang answers it (sgl-project/sglang
 * python/sglang/srt/entrypoints/http_server.py @ 0025436eab0556737d615b36a4dd3e1e26e82f3d
 * `retrieve_model`).
 */
export const model: RouteHandler = (ctx, req, res) => {
  ctx.auth.check(req.headers);
  const url = req.url ?? "";
  const q = url.indexOf("?");
  let id: string;
  try {
    id = decodeURIComponent((q < 0 ? url : url.slice(0, q)).slice(MODEL_CARD_PREFIX.length));
  } catch {
    throw new BadRequestError("The model id in the path is not valid percent-encoding.", "model");
  }
  const g = ctx.workers.group(id);
  if (!g) throw new NotFoundError(`The model '${echoInput(id)}' does not exist.`, "model_not_found", "model");
  sendJson(res, 200, modelCard(id, g.all[0]!.record));
};

function modelCard(id: string, first: WorkerRecord) {
  return {
    id,
    object: "model",
    created: Math.floor(Date.parse(first.startedAt) / 1000) || 0,
    owned_by: "infera",
    root: first.model,
    max_model_len: first.maxModelLen || undefined,
  };
}

function modelList(workers: WorkerSet) {
  const data = [];
  for (const name of workers.modelNames()) data.push(modelCard(name, workers.group(name)!.all[0]!.record));
  return { object: "list", data };
}

/** `?model=m&limit=n` over the decision ring, newest last. */
function decisionList(log: DecisionLog, query: string) {
  const params = new URLSearchParams(query);
  const model = params.get("model") ?? undefined;
  const n = Number(params.get("limit"));
  const limit = Number.isInteger(n) && n > 0 ? n : undefined;
  return { object: "list", capacity: log.capacity, data: log.list({ model, limit }) };
}

function workerList(ctx: Parameters<RouteHandler>[0]) {
  return {
    object: "list",
    data: ctx.workers.list().map((w) => ({
      // A record's URL may carry userinfo (a static file, an etcd record): never echo it.
      ...maskUrlsDeep(w.record),
      state: {
        available: w.available,
        breaker: w.breaker,
        inFlight: w.inFlight,
        pendingPrefillTokens: w.pendingPrefillTokens,
        routed: w.routed,
        engineLoad: w.engineLoad ?? null,
      },
      router: w.record.servedModelNames.map((n) => ({ model: n, kind: ctx.router.kindFor(n) })),
    })),
  };
}
