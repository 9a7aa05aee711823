/**
 * `startServer`: the OpenAI gateway on plain node:http (no framework on the hot path).
 * Wires discovery → WorkerSet → AutoRouter → request executor, plus metrics and the engine
 * load scraper. Used by `infera server`, `infera up` and the tests, in-process.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createDiscoveryWatcher } from "../discovery/index.ts";
import { MemoryDiscovery } from "../discovery/memory.ts";
import type { DiscoveryWatcher } from "../discovery/types.ts";
import { loadTokenizer, type Tokenizer } from "../kv/tokenizer.ts";
import { DrainingError, echoInput, InferaError, NotFoundError } from "../protocol/errors.ts";
import { AutoRouter } from "../router/auto.ts";
import type { PeerPlane } from "../router/peers/types.ts";
import { buildScheduling, type Scheduling } from "../router/pipeline/build.ts";
import { DecisionLog } from "../router/pipeline/decisions.ts";
import { TtftPredictor } from "../router/predict/ttft.ts";
import { WorkerSet } from "../router/worker-set.ts";
import { HttpExecutor } from "../transport/http.ts";
import { createLogger, type Logger } from "../util/log.ts";
import { maskUrlsDeep } from "../util/mask.ts";
import { ApiKeyAuth } from "./auth.ts";
import type { BodyParserPool } from "./body-parser-pool.ts";
import { builtinExtensions } from "./builtin-extensions.ts";
import { mergeConfig, type ServerConfig, type ServerConfigInput } from "./config.ts";
import { DASHBOARD_PATHS, handleDashboard } from "./dashboard/routes.ts";
import { DashboardState } from "./dashboard/state.ts";
import type { KvIngest, ManagedExecutor, ServerComponentContext, ServerExtensions } from "./extension-api.ts";
import { sendError, sendJson } from "./http-util.ts";
import { LoadScraper } from "./load-scraper.ts";
import { ServerMetrics } from "./metrics.ts";
import { DrainCutError, handleCompletion, type ProxyContext } from "./proxy.ts";
import { PromptStats } from "./routing-request.ts";
import { TokenPrefixCache } from "./token-prefix-cache.ts";
import { TtftReport } from "./ttft-sink.ts";

/**
 * How long /ready holds a new server out (503) while a rank's start-up KV replay still runs: long
 * enough for 8 engines × 10,000 steps of history (bench/kv-sync), short enough that one engine
 * whose replay stalls cannot keep a replica out for good. A rank that ends `unknown` never holds it.
 */
const DEFAULT_READY_WAIT_KV_SYNC_MS = 60_000;

export interface StartServerOptions {
  /** Use this watcher instead of building one from `config.discovery` (caller owns it). */
  discovery?: DiscoveryWatcher;
  /** Merged over the built-in extensions. */
  extensions?: ServerExtensions;
  /** Use this request executor instead of the configured request plane. */
  executor?: ManagedExecutor;
  logger?: Logger;
  /** Parses bodies past OFF_LOOP_BODY_BYTES (default: the process's shared pool; caller owns it). */
  bodyParser?: BodyParserPool;
}

export interface InferaServer {
  url: string;
  host: string;
  port: number;
  config: ServerConfig;
  discovery: DiscoveryWatcher;
  /** The discovery when it is in-memory (add/remove workers directly), else null. */
  memory: MemoryDiscovery | null;
  workers: WorkerSet;
  router: AutoRouter;
  metrics: ServerMetrics;
  executor: ManagedExecutor;
  scraper: LoadScraper;
  kvIngest: KvIngest | null;
  /** Routing state shared with peer replicas, when configured (src/router/peers). */
  peers: PeerPlane | null;
  tokenizer: Tokenizer;
  /** The scheduling profiles and what they need (what this server started). */
  scheduling: Scheduling;
  /** The last routing decisions, explained (GET /debug/decisions). */
  decisions: DecisionLog;
  /** The TTFT predictor (src/router/predict) and its error report (metric, dashboard). */
  ttft: TtftPredictor;
  ttftReport: TtftReport;
  httpServer: Server;
  /**
   * Graceful stop (SIGTERM): stop accepting, answer /ready 503 and new requests 503 on
   * connections still open, let requests in flight (streams included) finish for up to
   * `graceMs`, then close. Resolves with how many requests were still running at the end.
   */
  drain(graceMs: number): Promise<number>;
  close(): Promise<void>;
}

/** Completion requests whose responses have not closed yet (the drain waits for them). */
interface ActiveCount {
  n: number;
}

const REDACT = {
  paths: ["apiKeys", "*.apiKeys", "headers.authorization", "*.headers.authorization", 'headers["x-api-key"]'],
  censor: "[redacted]",
};

export async function startServer(
  input: ServerConfigInput = {},
  opts: StartServerOptions = {},
): Promise<InferaServer> {
  const config = mergeConfig(input);
  // First: a bad profile or policy option is refused before anything starts.
  const scheduling = buildScheduling({
    policy: config.policy,
    policyOptions: config.policyOptions,
    profiles: config.profiles,
    router: config.router,
  });
  const needs = scheduling.needs;
  const logger = (opts.logger ?? createLogger("server")).child({}, { redact: REDACT });
  const ext: ServerExtensions = {
    ...builtinExtensions,
    ...opts.extensions,
    executors: { ...builtinExtensions.executors, ...opts.extensions?.executors },
  };
  const tokenizer = await loadTokenizer(config.tokenizer);

  const ownsDiscovery = !opts.discovery;
  const discovery = opts.discovery ?? (await createDiscoveryWatcher(config.discovery, logger));
  await discovery.start();
  const workers = new WorkerSet(discovery, { logger, breaker: config.breaker });
  workers.attach();
  const metrics = new ServerMetrics(workers);
  const cctx: ServerComponentContext = {
    config,
    discovery,
    workers,
    registry: metrics.registry,
    tokenizer,
    logger,
  };

  // KV ingest only when a plugin of the used profiles reads the prefix index.
  const kvIngest = ext.kvIngestFactory && needs.has("kvIndex") ? await ext.kvIngestFactory(cctx) : null;
  const kvStartedAt = performance.now();
  const readyWaitKvSyncMs = config.ingest.readyWaitKvSyncMs ?? DEFAULT_READY_WAIT_KV_SYNC_MS;
  // Peers' routed prefixes, for the prefix scorers that read prompts.
  const peers = ext.peerPlaneFactory && needs.has("approxTree") ? await ext.peerPlaneFactory(cctx) : null;
  let executor: ManagedExecutor;
  if (opts.executor) executor = opts.executor;
  else if (config.requestPlane === "http") executor = new HttpExecutor(config.upstream);
  else {
    const f = ext.executors?.[config.requestPlane];
    if (!f) throw new Error(`unknown request plane '${config.requestPlane}'`);
    executor = await f(cctx);
  }
  workers.onChange((ev) => {
    if (ev.type !== "removed") return;
    const url = ev.worker.record.url;
    if (!workers.list().some((w) => w.record.url === url)) executor.forget?.(url);
  });

  const decisions = new DecisionLog();
  // One index serves every model (worker ids are unique across models).
  const syncIndex = kvIngest?.indexFor("");
  if (syncIndex?.syncOf) decisions.syncOf = (id) => syncIndex.syncOf?.(id) ?? null;
  // The TTFT predictor: passive until a profile's predicted-ttft / ttft-saturation uses it.
  const ttftReport = new TtftReport(metrics.registry, decisions);
  const ttft = new TtftPredictor({ sink: ttftReport });
  const router = new AutoRouter({
    workers,
    policy: config.policy,
    policyOptions: config.policyOptions,
    disagg: config.disagg,
    mode: config.router,
    disaggFactory: ext.disaggRouterFactory,
    maxRetries: config.maxRetries,
    modelGoneRetryMs: config.modelGoneRetryS * 1000,
    logger,
    kvIndexFor: kvIngest ? (m) => kvIngest.indexFor(m) : undefined,
    peersFor: peers ? (m) => peers.forModel(m) : undefined,
    observer: metrics,
    scheduling,
    decisions,
    ttft,
  });
  const scraper = new LoadScraper(workers, config.scrapeIntervalMs);
  // Engine load is scraped only when a plugin reads it (every PD decode step does).
  if (needs.has("engineLoad")) scraper.start();

  const auth = new ApiKeyAuth(config.apiKeys);
  const promptLimits = {
    budgetMs: config.promptBudgetMs,
    cache: config.promptCacheTokens > 0 ? new TokenPrefixCache(config.promptCacheTokens) : null,
    stats: new PromptStats(),
  };
  metrics.watchPrompts(promptLimits.stats, promptLimits.cache);
  const pctx: ProxyContext = {
    router,
    executor,
    tokenizer,
    metrics,
    auth,
    maxBodyBytes: config.maxBodyBytes,
    maxResponseBufferBytes: config.maxResponseBufferBytes,
    // Profiles that read the prompt (prefix matching, prefill accounting), and PD routing
    // (prefill accounting), get long prompts tokenized ahead, in slices.
    preparePrompt: needs.has("promptTokens") || needs.has("approxTree") || config.router !== "mixed",
    promptLimits,
    logger,
    bodyParser: opts.bodyParser,
    inFlight: new Set(),
  };
  /** Responses not yet finished: a drain tells their keep-alive connections to close. */
  const openResponses = new Set<ServerResponse>();

  let draining = false;
  const active: ActiveCount = { n: 0 };
  // The dashboard (GET /dashboard*): reads state the server keeps; nothing on the request path.
  const dashboard = {
    auth,
    state: new DashboardState({
      workers,
      router,
      metrics,
      decisions,
      policy: config.policy,
      kvIndexFor: kvIngest ? (m) => kvIngest.indexFor(m) : undefined,
      kvSync: () => kvIngest?.syncReport?.(),
      draining: () => draining,
      ttftErrors: () => ttftReport.summary(),
      // Waiting and KV usage need the engines' load: scraped from the first look on.
      onView: () => scraper.start(),
    }),
  };
  // One shared listener (no closure per request).
  const released = (): void => {
    active.n--;
  };
  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    req.on("error", () => {});
    res.on("error", () => {});
    // Browsers must take every answer as the content type it declares (issue #30 item 9).
    res.setHeader("x-content-type-options", "nosniff");
    // While draining, every answer closes its connection after it (keep-alive clients reconnect
    // to another replica); before, a response in flight at SIGTERM is told so by the drain.
    if (draining) res.setHeader("connection", "close");
    else {
      openResponses.add(res);
      res.once("close", () => openResponses.delete(res));
    }
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const path = q < 0 ? url : url.slice(0, q);
    const method = req.method;
    try {
      if (method === "POST") {
        if (draining) throw new DrainingError();
        active.n++;
        res.once("close", released);
        if (path === "/v1/chat/completions") {
          void handleCompletion(pctx, "chat", req, res);
          return;
        }
        if (path === "/v1/completions") {
          void handleCompletion(pctx, "completion", req, res);
          return;
        }
      } else if (method === "GET" || method === "HEAD") {
        if (
          path.startsWith("/dashboard") &&
          handleDashboard(dashboard, path, q < 0 ? "" : url.slice(q + 1), req, res)
        )
          return;
        switch (path) {
          case "/health":
            sendJson(res, 200, { status: "ok" });
            return;
          case "/ready": {
            if (draining) {
              sendJson(res, 503, { ready: false, draining: true }, { connection: "close" });
              return;
            }
            const live = workers.list().filter((w) => w.available).length;
            // Counts only: which worker is where is on /dashboard/state, behind the key.
            const kv = kvIngest?.syncReport?.();
            const holding =
              kv !== undefined && kv.syncing > 0 && performance.now() - kvStartedAt < readyWaitKvSyncMs;
            const ready = live > 0 && !holding;
            const kvIndex = kv
              ? { synced: kv.synced, syncing: kv.syncing, unknown: kv.unknown, waiting: holding }
              : undefined;
            sendJson(res, ready ? 200 : 503, { ready, workers: live, ...(kvIndex ? { kvIndex } : {}) });
            return;
          }
          case "/metrics":
            // It lists every worker's address: behind the API key unless made public.
            if (!config.metricsPublic) auth.check(req.headers);
            metrics.text().then(
              (text) => {
                res.writeHead(200, { "content-type": metrics.registry.contentType });
                res.end(text);
              },
              (err) => sendError(res, err, undefined, logger),
            );
            return;
          case "/v1/models":
            auth.check(req.headers);
            sendJson(res, 200, modelList(workers));
            return;
          case "/v1/workers":
            auth.check(req.headers);
            sendJson(res, 200, workerList(workers, router));
            return;
          case "/debug/decisions":
            // Worker ids, loads and prompts' cache state: behind the API key like /v1/workers.
            auth.check(req.headers);
            sendJson(res, 200, decisionList(decisions, q < 0 ? "" : url.slice(q + 1)));
            return;
        }
      }
      if (isKnownPath(path)) {
        throw new InferaError(405, `Method ${echoInput(method ?? "")} is not allowed on ${path}.`, {
          code: "method_not_allowed",
        });
      }
      throw new NotFoundError(`No route for ${echoInput(method ?? "")} ${echoInput(path)}.`, "not_found");
    } catch (err) {
      req.resume();
      sendError(res, err, undefined, logger);
    }
  };

  // Node requires headersTimeout ≤ requestTimeout (when the latter is on).
  const requestTimeout = config.requestTimeoutMs;
  const headersTimeout = requestTimeout > 0 ? Math.min(60_000, requestTimeout) : 60_000;
  // Node checks both only every connectionsCheckingInterval (30 s by default): check often
  // enough that a short configured limit fires near its time.
  const checkEvery = Math.max(100, Math.min(30_000, Math.floor(headersTimeout / 4)));
  const httpServer = createServer(
    { keepAliveTimeout: 65_000, headersTimeout, requestTimeout, connectionsCheckingInterval: checkEvery },
    handle,
  );
  httpServer.on("clientError", (err: NodeJS.ErrnoException, socket) => {
    if (err.code === "ECONNRESET" || !socket.writable) {
      socket.destroy();
      return;
    }
    socket.end(clientErrorResponse(err.code));
  });
  await new Promise<void>((resolve, reject) => {
    httpServer.once("error", reject);
    httpServer.listen(config.port, config.host, () => {
      httpServer.off("error", reject);
      resolve();
    });
  });
  const port = (httpServer.address() as AddressInfo).port;
  const hostForUrl = config.host.includes(":") ? `[${config.host}]` : config.host;
  const url = `http://${hostForUrl === "0.0.0.0" ? "127.0.0.1" : hostForUrl}:${port}`;
  logger.info(
    {
      url,
      discovery: config.discovery.kind,
      policy: config.policy,
      router: config.router,
      auth: auth.enabled,
    },
    "infera server listening",
  );

  const drain = async (graceMs: number): Promise<number> => {
    if (!draining) {
      draining = true;
      logger.info({ graceMs, active: active.n }, "draining: not accepting, waiting for requests in flight");
      // Stops the listener and closes idle keep-alive connections (Node >= 19).
      httpServer.close();
      // A keep-alive connection with a request in flight gets its answer, then is closed:
      // `connection: close` on answers not started, an end after those already streaming.
      for (const res of openResponses) {
        if (!res.headersSent) res.setHeader("connection", "close");
        else {
          // Taken now: by the time 'finish' listeners run, Node has detached it from `res`.
          const sock = res.socket;
          res.once("finish", () => sock?.end());
        }
      }
    }
    const deadline = Date.now() + graceMs;
    while (active.n > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    const left = active.n;
    if (left > 0) {
      logger.warn({ left, graceMs }, "drain: grace period over; cutting the requests in flight");
      // Each stream ends with an error event and [DONE], each unanswered request with a 503,
      // rather than a reset; a moment is left for those last writes before the sockets close.
      for (const a of pctx.inFlight ?? []) a.abort(new DrainCutError());
      const cutBy = Date.now() + 2000;
      while (active.n > 0 && Date.now() < cutBy) await new Promise((r) => setTimeout(r, 20));
    } else logger.info("drain: all requests finished");
    await close();
    return left;
  };

  let closing: Promise<void> | null = null;
  const close = (): Promise<void> => {
    closing ??= (async () => {
      scraper.stop();
      await new Promise<void>((resolve) => {
        httpServer.close(() => resolve());
        httpServer.closeAllConnections();
      });
      router.close();
      await kvIngest?.close();
      await peers?.close();
      await workers.close();
      await executor.close?.();
      if (ownsDiscovery) await discovery.close();
    })();
    return closing;
  };

  return {
    url,
    host: config.host,
    port,
    config,
    discovery,
    memory: discovery instanceof MemoryDiscovery ? discovery : null,
    workers,
    router,
    metrics,
    executor,
    scraper,
    kvIngest,
    peers,
    tokenizer,
    scheduling,
    decisions,
    ttft,
    ttftReport,
    httpServer,
    drain,
    close,
  };
}

/**
 * The raw answer to a request Node's HTTP parser refused (bad framing, bad headers, header
 * overflow, request timeout): still an OpenAI-shaped JSON error, so clients parse every error
 * the same way.
 */
function clientErrorResponse(code: string | undefined): string {
  const safeCode = /^[A-Z0-9_]{1,64}$/.test(code ?? "") ? code : "parse error";
  const [status, reason, err] =
    code === "HPE_HEADER_OVERFLOW"
      ? [431, "Request Header Fields Too Large", "request_header_fields_too_large"]
      : code === "ERR_HTTP_REQUEST_TIMEOUT"
        ? [408, "Request Timeout", "request_timeout"]
        : [400, "Bad Request", "malformed_request"];
  const message =
    status === 408 ? "The request was not received in time." : `Malformed HTTP request (${safeCode}).`;
  const body = JSON.stringify(new InferaError(status, message, { code: err }).toJSON());
  return (
    `HTTP/1.1 ${status} ${reason}\r\nconnection: close\r\ncontent-type: application/json\r\nx-content-type-options: nosniff\r\n` +
    `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  );
}

const KNOWN = new Set([
  "/health",
  "/ready",
  "/metrics",
  "/v1/models",
  "/v1/workers",
  "/debug/decisions",
  ...DASHBOARD_PATHS,
  "/v1/chat/completions",
  "/v1/completions",
]);
const isKnownPath = (p: string): boolean => KNOWN.has(p);

function modelList(workers: WorkerSet) {
  const data = [];
  for (const name of workers.modelNames()) {
    const g = workers.group(name)!;
    const first = g.all[0]!.record;
    data.push({
      id: name,
      object: "model",
      created: Math.floor(Date.parse(first.startedAt) / 1000) || 0,
      owned_by: "infera",
      root: first.model,
      max_model_len: first.maxModelLen || undefined,
    });
  }
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

function workerList(workers: WorkerSet, router: AutoRouter) {
  return {
    object: "list",
    data: workers.list().map((w) => ({
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
      router: w.record.servedModelNames.map((n) => ({ model: n, kind: router.kindFor(n) })),
    })),
  };
}
