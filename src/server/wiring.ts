/**
 * The server's wiring: builds every part `startServer` (./app.ts) needs, in order, starting only
 * what the scheduling needs: discovery → WorkerSet → AutoRouter → request executor, plus
 * metrics, the engine load scraper, KV ingest and peers. No listening here (./lifecycle.ts), no
 * routes (./routes.ts).
 */
import { createDiscoveryWatcher } from "../discovery/index.ts";
import type { DiscoveryWatcher } from "../discovery/types.ts";
import { AutoRouter } from "../router/auto.ts";
import { resolveFlowConfig } from "../router/flow/config-schema.ts";
import type { PeerPlane } from "../router/peers/types.ts";
import type { Scheduling } from "../router/pipeline/build.ts";
import { DecisionLog } from "../router/pipeline/decisions.ts";
import { TtftPredictor } from "../router/predict/ttft.ts";
import { WorkerSet } from "../router/worker-set.ts";
import { loadTokenizer, type Tokenizer } from "../tokenizer/tokenizer.ts";
import { HttpExecutor } from "../transport/http.ts";
import type { Logger } from "../util/log.ts";
import { ApiKeyAuth } from "./auth.ts";
import type { BodyParserPool } from "./body-parser-pool.ts";
import { builtinExtensions } from "./builtin-extensions.ts";
import type { ServerConfig } from "./config.ts";
import { DashboardState } from "./dashboard/state.ts";
import type { KvIngest, ManagedExecutor, ServerComponentContext, ServerExtensions } from "./extension-api.ts";
import { createFlowGate, type FlowGate } from "./flow-gate.ts";
import type { RequestTracker } from "./lifecycle.ts";
import { LoadScraper } from "./load-scraper.ts";
import { ServerMetrics } from "./metrics.ts";
import type { ProxyContext } from "./request-context.ts";
import type { RouteContext } from "./route-context.ts";
import { PromptStats } from "./routing-request.ts";
import { TokenPrefixCache } from "./token-prefix-cache.ts";
import { RequestTracer } from "./tracing.ts";
import { TtftReport } from "./ttft-sink.ts";

/**
 * How long /ready holds a new server out (503) while a rank's start-up KV replay still runs: long
 * enough for 8 engines × 10,000 steps of history (bench/kv-sync), short enough that one engine
 * whose replay stalls cannot keep a replica out for good. A rank that ends `unknown` never holds it.
 */
const DEFAULT_READY_WAIT_KV_SYNC_MS = 60_000;

/** What a caller may hand in instead of what the config would build. */
export interface WireOptions {
  /** Use this watcher instead of building one from `config.discovery` (caller owns it). */
  discovery?: DiscoveryWatcher;
  /** Merged over the built-in extensions. */
  extensions?: ServerExtensions;
  /** Use this request executor instead of the configured request plane. */
  executor?: ManagedExecutor;
  /** Parses bodies past OFF_LOOP_BODY_BYTES (default: the process's shared pool; caller owns it). */
  bodyParser?: BodyParserPool;
}

/** The server's parts, built before it listens. */
export interface Wired {
  tokenizer: Tokenizer;
  discovery: DiscoveryWatcher;
  ownsDiscovery: boolean;
  workers: WorkerSet;
  metrics: ServerMetrics;
  kvIngest: KvIngest | null;
  /** /ready holds the server out while a rank's start-up KV replay runs, until this time (ms). */
  kvSyncWaitUntil: number;
  peers: PeerPlane | null;
  executor: ManagedExecutor;
  decisions: DecisionLog;
  /** The TTFT predictor (src/router/predict) and where it reports (metric, decisions, dashboard). */
  ttft: TtftPredictor;
  ttftReport: TtftReport;
  router: AutoRouter;
  scraper: LoadScraper;
  /** Flow control (config `flow`), when on. */
  flow: FlowGate | undefined;
  auth: ApiKeyAuth;
  proxy: ProxyContext;
}

/** Builds every part the server needs, in order; starts only what the scheduling needs. */
export async function wire(
  config: ServerConfig,
  scheduling: Scheduling,
  logger: Logger,
  opts: WireOptions,
): Promise<Wired> {
  const needs = scheduling.needs;
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
  const kvSyncWaitUntil =
    performance.now() + (config.ingest.readyWaitKvSyncMs ?? DEFAULT_READY_WAIT_KV_SYNC_MS);
  // Peers: their routed prefixes, for the prefix scorers that read prompts; one engine scrape
  // shared among replicas, when a plugin reads engine load or flow control checks headroom.
  const scrapes = needs.has("engineLoad") || resolveFlowConfig(config.flow).enabled;
  const peers =
    ext.peerPlaneFactory && (needs.has("approxTree") || scrapes) ? await ext.peerPlaneFactory(cctx) : null;
  const executor = await requestExecutor(config, ext, cctx, opts);
  workers.onChange((ev) => {
    if (ev.type !== "removed") return;
    const url = ev.worker.record.url;
    if (!workers.list().some((x) => x.record.url === url)) executor.forget?.(url);
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
  metrics.watchBridges(() => router.bridgeCounters());
  // Scrapes share the request plane's per-worker pools when it is HTTP (one connection set per
  // engine; see HttpExecutor.dispatcherFor).
  const scraper = new LoadScraper(
    workers,
    config.scrapeIntervalMs,
    config.scrapeIdleIntervalMs,
    executor instanceof HttpExecutor ? (url) => executor.dispatcherFor(url) : undefined,
  );
  if (peers?.load) scraper.shareWith(peers.load);
  metrics.watchScraper(scraper);
  const flow = createFlowGate(config.flow, workers, metrics.registry, scraper, ttft, (m) =>
    router.policyFor(m),
  );
  // Engine load is scraped only when a plugin reads it (every PD decode step does), or for
  // flow control's headroom.
  if (needs.has("engineLoad") || flow) scraper.start();

  const auth = new ApiKeyAuth(config.apiKeys);
  const parts = { tokenizer, discovery, ownsDiscovery, workers, metrics, kvIngest, kvSyncWaitUntil, peers };
  const built = { ...parts, executor, decisions, ttft, ttftReport, router, scraper, flow, auth };
  return { ...built, proxy: proxyContext(config, scheduling, logger, opts, built) };
}

/** The configured request plane's executor (or the caller's). */
async function requestExecutor(
  config: ServerConfig,
  ext: ServerExtensions,
  cctx: ServerComponentContext,
  opts: WireOptions,
): Promise<ManagedExecutor> {
  if (opts.executor) return opts.executor;
  if (config.requestPlane === "http") return new HttpExecutor(config.upstream);
  const f = ext.executors?.[config.requestPlane];
  if (!f) throw new Error(`unknown request plane '${config.requestPlane}'`);
  return await f(cctx);
}

/** What the completion handlers read (./proxy.ts). */
function proxyContext(
  config: ServerConfig,
  scheduling: Scheduling,
  logger: Logger,
  opts: WireOptions,
  w: Omit<Wired, "proxy">,
): ProxyContext {
  const needs = scheduling.needs;
  const promptLimits = {
    budgetMs: config.promptBudgetMs,
    cache: config.promptCacheTokens > 0 ? new TokenPrefixCache(config.promptCacheTokens) : null,
    stats: new PromptStats(),
  };
  w.metrics.watchPrompts(promptLimits.stats, promptLimits.cache);
  return {
    router: w.router,
    executor: w.executor,
    tokenizer: w.tokenizer,
    metrics: w.metrics,
    auth: w.auth,
    maxBodyBytes: config.maxBodyBytes,
    maxResponseBufferBytes: config.maxResponseBufferBytes,
    // Profiles that read the prompt (prefix matching, prefill accounting), and PD routing
    // (prefill accounting), get long prompts tokenized ahead, in slices.
    preparePrompt: needs.has("promptTokens") || needs.has("approxTree") || config.router !== "mixed",
    promptLimits,
    logger,
    bodyParser: opts.bodyParser,
    inFlight: new Set(),
    // Tracing only when asked for: otherwise no tracer exists and requests carry no trace.
    tracer: config.otlpEndpoint ? new RequestTracer({ endpoint: config.otlpEndpoint }) : undefined,
    flow: w.flow,
  };
}

/** What every route handler reads (./route-context.ts). */
export function routeContext(
  config: ServerConfig,
  w: Wired,
  tracker: RequestTracker,
  logger: Logger,
): RouteContext {
  const { auth, workers, router, metrics, decisions, kvIngest } = w;
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
      draining: () => tracker.draining,
      ttftErrors: () => w.ttftReport.summary(),
      flow: w.flow ? w.flow.snapshot.bind(w.flow) : undefined,
      // Waiting and KV usage need the engines' load: scraped from the first look on.
      onView: () => w.scraper.start(),
    }),
  };
  return {
    config,
    auth,
    workers,
    router,
    metrics,
    decisions,
    kvIngest,
    proxy: w.proxy,
    dashboard,
    logger,
    draining: () => tracker.draining,
    kvSyncWaitUntil: w.kvSyncWaitUntil,
  };
}
