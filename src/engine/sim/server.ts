import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { loadTokenizer, type Tokenizer } from "../../tokenizer/tokenizer.ts";
import { createLogger } from "../../util/log.ts";
import { createSimServer } from "./api.ts";
import { parseSimArgs } from "./args.ts";
import { offsetEndpointPort, parseKvEventsConfig, type SimConfig } from "./config.ts";
import { SimEngine } from "./engine.ts";
import { SimKvHostImpl } from "./kv-host.ts";
import { KvEventPublisher } from "./kv-publisher.ts";
import { LogprobModel } from "./logprobs.ts";
import { itlFamilyFor } from "./metrics.ts";
import { OutputVocab } from "./output.ts";
import { createSimConnector } from "./pd/index.ts";
import type { SimConnector, SimConnectorOptions, SimKvHost } from "./pd/types.ts";
import { personalityOf } from "./personalities/index.ts";
import { SimTracer } from "./tracing.ts";

/** Builds the PD connector; the default is pd/index.ts's createSimConnector (tests inject fakes). */
export type ConnectorFactory = (opts: SimConnectorOptions, host: SimKvHost) => SimConnector | null;

/** How a fleet (fleet.ts) starts one of its engines; a lone engine needs none of it. */
export interface StartExtras {
  /** The engine's index in its fleet: named in its logs; its "ready" line drops to debug. */
  fleetIndex?: number;
}

/**
 * What engines of one process can share because nothing writes to it: the output vocabulary
 * and the logprob model are built once per tokenizer (loadTokenizer already memoises the
 * tokenizer per directory), so a fleet of engines costs one copy, not N.
 */
const sharedOutput = new WeakMap<Tokenizer, { vocab: OutputVocab; lpModel: LogprobModel }>();
function outputFor(tokenizer: Tokenizer): { vocab: OutputVocab; lpModel: LogprobModel } {
  let o = sharedOutput.get(tokenizer);
  if (!o) {
    const vocab = OutputVocab.build(tokenizer);
    o = { vocab, lpModel: new LogprobModel(vocab, tokenizer) };
    sharedOutput.set(tokenizer, o);
  }
  return o;
}

export interface SimStartOptions extends Partial<Omit<SimConfig, "kvEvents">> {
  /** vLLM `--kv-events-config`, as JSON text or an object. */
  kvEvents?: string | Record<string, unknown> | null;
  /** Extra vLLM-style arguments parsed first (options given here override them). */
  argv?: string[];
  connectorFactory?: ConnectorFactory;
}

export interface SimHandle {
  url: string;
  port: number;
  config: SimConfig;
  /** Rank 0's engine (the PD connector's). */
  engine: SimEngine;
  /** One engine per DP rank this process serves. */
  engines: SimEngine[];
  /** Each rank's KV-event endpoints (connectable form), when events are on. */
  kvRanks: { rank: number; endpoint: string; replayEndpoint: string | null }[];
  /** Where a subscriber connects (the bound endpoint with `*` replaced by the host), when events are on. */
  kvEndpoint: string | null;
  replayEndpoint: string | null;
  connector: SimConnector | null;
  kvHost: SimKvHostImpl;
  close(): Promise<void>;
}

function connectable(endpoint: string, host: string): string {
  const h = host === "0.0.0.0" || host === "::" || host === "" ? "127.0.0.1" : host;
  return endpoint.replace("://*:", `://${h}:`).replace("://0.0.0.0:", `://${h}:`);
}

/** Starts a simulated engine in this process. */
export async function startSimEngine(opts: SimStartOptions = {}): Promise<SimHandle> {
  const base = parseSimArgs(opts.argv ?? []).config;
  const { kvEvents, argv: _argv, connectorFactory, ...rest } = opts;
  const cfg: SimConfig = { ...base, ...rest } as SimConfig;
  // A caller naming one rank gets that rank alone (vLLM's --data-parallel-rank), not all of them.
  if (opts.dpRank !== undefined && opts.dpLocal === undefined) cfg.dpLocal = false;
  if (opts.model && !opts.servedModelNames && !(opts.argv ?? []).includes("--served-model-name")) {
    cfg.servedModelNames = [opts.model];
  }
  if (kvEvents !== undefined) cfg.kvEvents = kvEvents === null ? null : parseKvEventsConfig(kvEvents);
  return startWithConfig(cfg, connectorFactory);
}

export async function startWithConfig(
  cfg: SimConfig,
  connectorFactory: ConnectorFactory = createSimConnector,
  extras: StartExtras = {},
): Promise<SimHandle> {
  const fleet = extras.fleetIndex;
  const log = createLogger("sim", {
    model: cfg.model,
    role: cfg.role,
    ...(fleet !== undefined ? { fleetIndex: fleet } : {}),
  });
  const tokenizer = await loadTokenizer(cfg.tokenizerDir);
  const { vocab, lpModel } = outputFor(tokenizer);
  // One scheduler + pool + KV publisher per data-parallel rank this process serves.
  const ranks = cfg.dpLocal ? Array.from({ length: cfg.dpSize }, (_, r) => r) : [cfg.dpRank];
  const personality = personalityOf(cfg.engine);
  const sharedItl =
    itlFamilyFor({ ...cfg, personality, modelName: cfg.servedModelNames[0], dpRank: ranks[0] }) ?? undefined;
  const engines = ranks.map((r) => new SimEngine(cfg, personality, log, r, sharedItl));
  const engine = engines[0];
  const engineId = `sim-${randomUUID()}`;
  const advertisedHost = cfg.host === "0.0.0.0" || cfg.host === "::" ? "127.0.0.1" : cfg.host;
  const kvHost = new SimKvHostImpl(engine, {
    engineId,
    host: advertisedHost,
    holdTimeoutMs: cfg.holdTimeoutMs,
  });

  engine.heldForTransfer = () => kvHost.numHeld;

  const publishers: KvEventPublisher[] = [];
  const kvRanks: { rank: number; endpoint: string; replayEndpoint: string | null }[] = [];
  /** A failed start-up releases what it started. */
  const abandon = async (): Promise<void> => {
    for (const e of engines) e.close();
    kvHost.close();
    await Promise.all(publishers.map((p) => p.close()));
  };
  if (cfg.kvEvents) {
    const ev = cfg.kvEvents;
    const layout = personality.kvLayout(cfg.kvEventsEncoding);
    try {
      for (const e of engines) {
        const offset = personality.kvRankPortOffset(e.rank);
        const endpoint = offsetEndpointPort(ev.endpoint, offset);
        const replay = ev.replay_endpoint ? offsetEndpointPort(ev.replay_endpoint, offset) : null;
        const publisher = new KvEventPublisher(ev, layout, cfg.kvEventsFraming, e.rank, log);
        publishers.push(publisher);
        const mode = cfg.engineExplicit ? personality.kvPubMode(endpoint) : "bind";
        if (mode === "connect")
          log.warn(
            { endpoint },
            "KV events endpoint is not a wildcard: the engine connects instead of binding",
          );
        const bound = await publisher.start(endpoint, replay, mode);
        e.publisher = publisher;
        kvRanks.push({
          rank: e.rank,
          endpoint: connectable(bound.pub, advertisedHost),
          replayEndpoint: bound.replay ? connectable(bound.replay, advertisedHost) : null,
        });
      }
    } catch (err) {
      await abandon();
      throw err;
    }
  }
  const kvEndpoint = kvRanks[0]?.endpoint ?? null;
  const replayEndpoint = kvRanks[0]?.replayEndpoint ?? null;
  let connector: SimConnector | null = null;
  const tracer = cfg.otlpTracesEndpoint
    ? new SimTracer(cfg.otlpTracesEndpoint, `${cfg.engine}-sim`)
    : undefined;
  const server = createSimServer({
    tracer,
    cfg,
    personality,
    engines,
    tokenizer,
    vocab,
    lpModel,
    kvHost,
    connector: () => connector,
    log,
    startedAt: Date.now(),
  });
  try {
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(cfg.port, cfg.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
  } catch (err) {
    // e.g. EADDRINUSE: nothing may be left running (the KV publisher's sockets would keep a
    // failed process alive).
    await abandon();
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  kvHost.httpPort = port;
  try {
    connector = connectorFactory(
      {
        kind: cfg.connector,
        role: cfg.role,
        kvTransferConfig: cfg.kvTransferConfig,
        holdTimeoutMs: cfg.holdTimeoutMs,
      },
      kvHost,
    );
    await connector?.start();
  } catch (err) {
    server.close();
    await abandon();
    throw err;
  }
  const urlHost = advertisedHost.includes(":") ? `[${advertisedHost}]` : advertisedHost;
  const url = `http://${urlHost}:${port}`;
  (fleet !== undefined ? log.debug.bind(log) : log.info.bind(log))(
    {
      url,
      kvEndpoint,
      replayEndpoint,
      blocks: cfg.numGpuBlocks,
      blockSize: cfg.blockSize,
      tokenizer: tokenizer.id,
    },
    "sim engine ready",
  );
  let closed = false;
  return {
    url,
    port,
    config: cfg,
    engine,
    engines,
    kvRanks,
    kvEndpoint,
    replayEndpoint,
    connector,
    kvHost,
    async close() {
      if (closed) return;
      closed = true;
      for (const e of engines) e.close();
      kvHost.close();
      await connector?.close();
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await Promise.all(publishers.map((p) => p.close()));
      await tracer?.shutdown().catch(() => {});
    },
  };
}
