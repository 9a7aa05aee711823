import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import {
  AuthenticationError,
  InferaError,
  InvalidJsonError,
  NotFoundError,
  toInferaError,
} from "../../protocol/errors.ts";
import { readBody, releaseBody, sendJson } from "../../server/http-util.ts";
import { addsSpecialTokens, type Tokenizer } from "../../tokenizer/tokenizer.ts";
import type { Logger } from "../../util/log.ts";
import { addChoices } from "./choices.ts";
import type { SimConfig } from "./config.ts";
import { pickEngine } from "./dp-pick.ts";
import type { SimEngine } from "./engine.ts";
import type { SimKvHostImpl } from "./kv-host.ts";
import type { LogprobModel } from "./logprobs.ts";
import { combinedMetricsText } from "./metrics.ts";
import { parseSimRequest, type SimRequest } from "./openai-request.ts";
import type { OutputVocab } from "./output.ts";
import type { PdRequestInfo, SimConnector } from "./pd/types.ts";
import type { Personality } from "./personalities/types.ts";
import { type AnswerPlan, planAnswer } from "./request-plan.ts";
import { RequestResponder } from "./response.ts";
import type { SimTracer } from "./tracing.ts";

const MAX_BODY = 64 * 1024 * 1024;

export interface ApiDeps {
  cfg: SimConfig;
  /** The engine whose surface this sim presents (looked up once from cfg.engine). */
  personality: Personality;
  /** One engine per DP rank this process serves; [0] is the PD connector's. */
  engines: SimEngine[];
  tokenizer: Tokenizer;
  vocab: OutputVocab;
  lpModel: LogprobModel;
  kvHost: SimKvHostImpl;
  /** Set once the connector has started (null for mixed workers). */
  connector: () => SimConnector | null;
  log: Logger;
  startedAt: number;
  /** Set when started with `--otlp-traces-endpoint` (./tracing.ts). */
  tracer?: SimTracer;
}

/**
 * A request's JSON body (an empty body is `{}`), read with the server's bounded reader: a body
 * over MAX_BODY is a 413, bad JSON a 400.
 */
async function readJson(req: IncomingMessage): Promise<unknown> {
  const raw = await readBody(req, MAX_BODY);
  let text: string;
  try {
    text = raw.toString("utf8");
  } finally {
    releaseBody(raw);
  }
  if (text.length === 0) return {};
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new InvalidJsonError((err as Error).message);
  }
}

export function sendError(
  res: ServerResponse,
  err: unknown,
  requestId: string | undefined,
  personality: Personality,
): void {
  const e = toInferaError(err);
  if (res.headersSent) {
    // Mid-stream: an SSE error event, then close.
    if (!res.writableEnded) res.end(`data: ${JSON.stringify(e.toJSON())}\n\ndata: [DONE]\n\n`);
    return;
  }
  const answer = personality.errorAnswer(e);
  sendJson(res, e.status, answer.body, {
    ...answer.headers,
    ...(requestId ? { "x-request-id": requestId } : {}),
  });
}

/** The OpenAI-compatible HTTP server of the simulated engine. */
export function createSimServer(deps: ApiDeps): Server {
  const { log } = deps;
  const server = createServer((req, res) => {
    handle(deps, req, res).catch((err: unknown) => {
      if (!(err instanceof InferaError)) log.error({ err }, "request failed");
      sendError(res, err, undefined, deps.personality);
    });
  });
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;
  return server;
}

async function handle(deps: ApiDeps, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const { cfg } = deps;
  const engine = deps.engines[0];
  const url = req.url ?? "/";
  const q = url.indexOf("?");
  const path = q >= 0 ? url.slice(0, q) : url;
  const method = req.method ?? "GET";

  if (cfg.apiKey && path.startsWith("/v1/")) {
    const auth = req.headers.authorization ?? "";
    if (auth !== `Bearer ${cfg.apiKey}`) throw new AuthenticationError();
  }
  if (method === "POST" && (path === "/v1/chat/completions" || path === "/v1/completions")) {
    return handleCompletion(deps, path === "/v1/chat/completions" ? "chat" : "completion", req, res);
  }
  if (method === "GET" || method === "HEAD") {
    const native = deps.personality.getRoutes(cfg)[path];
    if (native) return sendJson(res, 200, native());
    switch (path) {
      case "/health":
        if (deps.personality.healthBody !== null) return sendJson(res, 200, deps.personality.healthBody);
        res.writeHead(200, { "content-length": 0 });
        res.end();
        return;
      case "/ping":
        res.writeHead(200, { "content-length": 0 });
        res.end();
        return;
      case "/metrics": {
        const text = await combinedMetricsText(deps.engines.map((e) => e.metrics));
        res.writeHead(200, { "content-type": engine.metrics.registry.contentType });
        res.end(text);
        return;
      }
      case "/v1/models":
        return sendJson(res, 200, {
          object: "list",
          data: cfg.servedModelNames.map((id) => ({
            id,
            object: "model",
            created: Math.floor(deps.startedAt / 1000),
            owned_by: "vllm",
            root: cfg.model,
            parent: null,
            max_model_len: cfg.maxModelLen,
            permission: [],
          })),
        });
      case "/version":
        return sendJson(res, 200, { version: "0.0.0-infera-sim" });
    }
    const routes = deps.connector()?.httpRoutes?.();
    const route = routes?.[path];
    if (route) return sendJson(res, 200, await route());
  }
  const post = method === "POST" ? deps.personality.postRoutes[path] : undefined;
  if (post) return post(deps, req, res);
  if (method === "POST" && path === "/reset_prefix_cache") {
    const ok = deps.engines.map((e) => e.resetPrefixCache()).every(Boolean);
    return sendJson(res, ok ? 200 : 409, { success: ok });
  }
  if (method === "POST" && path === "/tokenize") {
    const body = (await readJson(req)) as Record<string, unknown>;
    const tok = deps.tokenizer;
    let ids: number[];
    // vLLM's /tokenize: add_special_tokens defaults as on the matching completion endpoint.
    if (Array.isArray(body.messages)) {
      const messages = body.messages as Parameters<Tokenizer["applyChatTemplate"]>[0];
      ids = tok.encode(tok.applyChatTemplate(messages), addsSpecialTokens("chat", body));
    } else if (typeof body.prompt === "string")
      ids = tok.encode(body.prompt, addsSpecialTokens("completion", body));
    else throw new InferaError(400, "'prompt' (string) or 'messages' is required", { param: "prompt" });
    return sendJson(res, 200, { count: ids.length, max_model_len: cfg.maxModelLen, tokens: ids });
  }
  throw new NotFoundError(`No route for ${method} ${path}`);
}

function pdPhaseOf(
  connector: SimConnector | null,
  body: Record<string, unknown>,
): "prefill" | "decode" | null {
  if (!connector) return null;
  if (connector.pdPhase) return connector.pdPhase(body);
  const p = body.kv_transfer_params as Record<string, unknown> | undefined | null;
  if (!p || typeof p !== "object") return null;
  if (p.do_remote_decode === true) return "prefill";
  if (p.do_remote_prefill === true) return "decode";
  return null;
}

/** The request validated as the engine validates it, and what it asks beyond free text. */
function parseAndPlan(
  deps: ApiDeps,
  kind: "chat" | "completion",
  raw: unknown,
): { r: SimRequest; plan: AnswerPlan } {
  const { cfg } = deps;
  deps.personality.checkModelName(cfg, raw);
  const r = parseSimRequest(kind, raw, deps.tokenizer, {
    servedModelNames: cfg.servedModelNames,
    maxModelLen: cfg.maxModelLen,
    maxLogprobs: cfg.maxLogprobs,
  });
  const plan = planAnswer(kind, r.body, r.n, deps.personality.requests, cfg);
  const longest = Math.max(...r.prompts.map((p) => p.length));
  const blocksNeeded = Math.ceil((longest + 1) / cfg.blockSize);
  if (blocksNeeded > cfg.numGpuBlocks) {
    throw new InferaError(
      400,
      `The prompt needs ${blocksNeeded} KV blocks but the engine has ${cfg.numGpuBlocks}.`,
      {
        param: kind === "chat" ? "messages" : "prompt",
        code: "context_length_exceeded",
      },
    );
  }
  return { r, plan };
}

async function handleCompletion(
  deps: ApiDeps,
  kind: "chat" | "completion",
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const { cfg } = deps;
  const headerId = req.headers["x-request-id"];
  const requestId = (Array.isArray(headerId) ? headerId[0] : headerId) || randomUUID().replaceAll("-", "");
  const arrivalMs = performance.now();
  let raw: unknown;
  try {
    raw = await readJson(req);
  } catch (err) {
    return sendError(res, err, requestId, deps.personality);
  }
  let parsed: { r: SimRequest; plan: AnswerPlan };
  let engine: SimEngine;
  try {
    parsed = parseAndPlan(deps, kind, raw);
  } catch (err) {
    return sendError(res, err, requestId, deps.personality);
  }
  const { r, plan } = parsed;

  const connector = deps.connector();
  const phase = pdPhaseOf(connector, r.body);
  try {
    // PD requests use rank 0 (the connector's KV host); others the pinned or least-loaded rank.
    engine = phase ? deps.engines[0] : pickEngine(deps, req, r.body);
  } catch (err) {
    return sendError(res, err, requestId, deps.personality);
  }
  const info: PdRequestInfo | null = phase
    ? { requestId, params: r.kvTransferParams ?? {}, body: r.body, promptTokenIds: r.prompts[0] }
    : null;
  let gone = false;
  const pullAbort = new AbortController();
  const responder = new RequestResponder(res, {
    kind,
    requestId,
    model: r.model,
    created: Math.floor(Date.now() / 1000),
    stream: r.stream,
    includeUsage: r.includeUsage,
    continuousUsage: r.stream && plan.continuousUsage,
    numPrompts: r.prompts.length,
    n: phase === "prefill" ? 1 : r.n,
    streamInterval: cfg.streamInterval,
    logprobs: r.logprobs,
    echoTexts: r.echoTexts,
    echoOnly: r.echoOnly,
    lpModel: r.logprobs !== null || r.echoTexts ? deps.lpModel : null,
  });
  if (deps.tracer && req.headers.traceparent !== undefined) {
    const tracer = deps.tracer;
    const arrival = Date.now() - (performance.now() - arrivalMs);
    res.once("close", () =>
      tracer.request(
        req.headers,
        requestId,
        arrival,
        { "gen_ai.usage.prompt_tokens": r.prompts[0]?.length ?? 0, "infera.sim.pd_phase": phase ?? "none" },
        !responder.finished,
      ),
    );
  }
  res.on("close", () => {
    if (responder.finished) return;
    gone = true;
    responder.markGone();
    pullAbort.abort();
    for (const s of responder.seqs) engine.abort(s);
  });

  try {
    if (phase && info && connector) {
      connector.validate?.(info, phase);
      if (phase === "decode") {
        deps.kvHost.setSalt(requestId, r.salt);
        engine.pendingPulls++;
        let pulled: Awaited<ReturnType<SimConnector["pullForDecode"]>>;
        try {
          pulled = await connector.pullForDecode(info, pullAbort.signal);
        } finally {
          engine.pendingPulls--;
        }
        if (!gone) deps.kvHost.importBlocks(requestId, pulled.tokenIds);
      } else {
        responder.beforeEnd = async () => {
          const held = deps.kvHost.holdBlocks(requestId);
          if (!held) return;
          const params = await connector.onPrefillFinished(info, held);
          if (params) responder.extra.kv_transfer_params = params;
        };
      }
    }
  } catch (err) {
    engine.scheduler.dropImport(requestId);
    deps.kvHost.setSalt(requestId, null);
    return sendError(res, err, requestId, deps.personality);
  }
  if (gone) {
    engine.scheduler.dropImport(requestId);
    deps.kvHost.setSalt(requestId, null);
    return;
  }

  addChoices({
    cfg,
    r,
    plan,
    rules: deps.personality.requests,
    vocab: deps.vocab,
    requestId,
    phase,
    responder,
    arrivalMs,
  });
  responder.begin();
  for (const s of responder.seqs) engine.submit(s);
}
