/**
 * `startServer`: the OpenAI gateway on plain node:http (no framework on the hot path).
 * The wiring: discovery → WorkerSet → AutoRouter → request executor, plus metrics, the engine
 * load scraper, KV ingest and peers when the scheduling needs them. The routes are a table
 * (./routes.ts); listening, drain and close are ./lifecycle.ts. Used by `infera server`,
 * `infera up` and the tests, in-process.
 */
import type { Server } from "node:http";
import { MemoryDiscovery } from "../discovery/memory.ts";
import type { DiscoveryWatcher } from "../discovery/types.ts";
import { DrainingError } from "../protocol/errors.ts";
import type { AutoRouter } from "../router/auto.ts";
import type { PeerPlane } from "../router/peers/types.ts";
import { buildScheduling, type Scheduling } from "../router/pipeline/build.ts";
import type { DecisionLog } from "../router/pipeline/decisions.ts";
import type { TtftPredictor } from "../router/predict/ttft.ts";
import type { WorkerSet } from "../router/worker-set.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { createLogger, type Logger } from "../util/log.ts";
import { mergeConfig, type ServerConfig, type ServerConfigInput } from "./config.ts";
import type { KvIngest, ManagedExecutor } from "./extension-api.ts";
import { RawFront } from "./front/front.ts";
import {
  closeOnce,
  createHttpServer,
  drainer,
  KEEP_ALIVE_TIMEOUT_MS,
  listen,
  RequestTracker,
} from "./lifecycle.ts";
import type { LoadScraper } from "./load-scraper.ts";
import type { ServerMetrics } from "./metrics.ts";
import { createDispatcher, isHotPath } from "./routes.ts";
import type { TtftReport } from "./ttft-sink.ts";
import { routeContext, type WireOptions, wire } from "./wiring.ts";

export interface StartServerOptions extends WireOptions {
  logger?: Logger;
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
  const logger = (opts.logger ?? createLogger("server")).child({}, { redact: REDACT });
  const w = await wire(config, scheduling, logger, opts);
  const tracker = new RequestTracker();
  const ctx = routeContext(config, w, tracker, logger);
  const dispatch = createDispatcher(ctx, tracker);
  const httpServer = createHttpServer(config, dispatch);
  const front =
    config.httpFront === "raw"
      ? new RawFront(httpServer, {
          isHot: isHotPath,
          handle: dispatch,
          keepAliveTimeoutMs: KEEP_ALIVE_TIMEOUT_MS,
        })
      : null;
  if (front) w.metrics.watchFront(front);
  const { port, url } = await listen(httpServer, config);
  logger.info(
    {
      url,
      discovery: config.discovery.kind,
      policy: config.policy,
      router: config.router,
      auth: w.auth.enabled,
    },
    "infera server listening",
  );
  const close = closeOnce(
    httpServer,
    front,
    () => w.scraper.stop(),
    async () => {
      w.router.close();
      await w.kvIngest?.close();
      await w.peers?.close();
      await w.workers.close();
      await w.executor.close?.();
      await w.proxy.tracer?.shutdown().catch(() => {});
      if (w.ownsDiscovery) await w.discovery.close();
    },
  );
  // Requests queued for admission go to another replica at once (503 server_draining).
  const closeQueue = () => w.flow?.queue.close(new DrainingError());
  const drain = drainer({
    tracker,
    httpServer,
    front,
    logger,
    inFlight: w.proxy.inFlight,
    closeQueue,
    close,
  });
  return {
    url,
    host: config.host,
    port,
    config,
    discovery: w.discovery,
    memory: w.discovery instanceof MemoryDiscovery ? w.discovery : null,
    workers: w.workers,
    router: w.router,
    metrics: w.metrics,
    executor: w.executor,
    scraper: w.scraper,
    kvIngest: w.kvIngest,
    peers: w.peers,
    tokenizer: w.tokenizer,
    scheduling,
    decisions: w.decisions,
    ttft: w.ttft,
    ttftReport: w.ttftReport,
    httpServer,
    drain,
    close,
  };
}
