/**
 * The server's lifecycle: the node:http server (timeouts, malformed requests), listening, the
 * per-request bookkeeping a drain needs (which answers are open, how much work is in flight),
 * the drain and the close. The route table (./routes.ts) and the wiring (./app.ts) stay out of
 * it.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { DrainingError, InferaError } from "../protocol/errors.ts";
import type { RequestAbort } from "../util/abort.ts";
import type { Logger } from "../util/log.ts";
import type { ServerConfig } from "./config.ts";
import type { RawFront } from "./front/front.ts";
import { DrainCutError } from "./request-context.ts";

/**
 * What a drain needs to know of the requests: whether one started, which answers are still open
 * (their keep-alive connections get closed), and how many POSTs (work) have not closed yet.
 */
export class RequestTracker {
  draining = false;
  /** POST requests whose responses have not closed yet (the drain waits for them). */
  active = 0;
  /** Responses not yet finished: a drain tells their keep-alive connections to close. */
  readonly open = new Set<ServerResponse>();
  // One shared listener (no closure per request).
  private readonly released = (): void => {
    this.active--;
  };

  /** Every request, first thing. */
  onRequest(res: ServerResponse): void {
    // While draining, every answer closes its connection after it (keep-alive clients reconnect
    // to another replica); before, a response in flight at SIGTERM is told so by the drain.
    if (this.draining) res.setHeader("connection", "close");
    else {
      this.open.add(res);
      res.once("close", () => this.open.delete(res));
    }
  }

  /** A POST (work, any path): refused while draining, else counted until its response closes. */
  admitPost(res: ServerResponse): void {
    if (this.draining) throw new DrainingError();
    this.active++;
    res.once("close", this.released);
  }
}

/** How long an idle client connection is kept (node:http's and the raw front's). */
export const KEEP_ALIVE_TIMEOUT_MS = 65_000;

/** The node:http server with the configured timeouts; malformed requests get a JSON error. */
export function createHttpServer(
  config: ServerConfig,
  handle: (req: IncomingMessage, res: ServerResponse) => void,
): Server {
  // Node requires headersTimeout ≤ requestTimeout (when the latter is on).
  const requestTimeout = config.requestTimeoutMs;
  const headersTimeout = requestTimeout > 0 ? Math.min(60_000, requestTimeout) : 60_000;
  // Node checks both only every connectionsCheckingInterval (30 s by default): check often
  // enough that a short configured limit fires near its time.
  const checkEvery = Math.max(100, Math.min(30_000, Math.floor(headersTimeout / 4)));
  const httpServer = createServer(
    {
      keepAliveTimeout: KEEP_ALIVE_TIMEOUT_MS,
      headersTimeout,
      requestTimeout,
      connectionsCheckingInterval: checkEvery,
    },
    handle,
  );
  httpServer.on("clientError", (err: NodeJS.ErrnoException, socket) => {
    if (err.code === "ECONNRESET" || !socket.writable) {
      socket.destroy();
      return;
    }
    socket.end(clientErrorResponse(err.code));
  });
  return httpServer;
}

/** Listens on the configured address; resolves with the bound port and the URL to reach it. */
export async function listen(
  httpServer: Server,
  config: ServerConfig,
): Promise<{ port: number; url: string }> {
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
  return { port, url };
}

/**
 * One close, however often called: stop `beforeHttp` (what feeds new work), close the listener
 * and every connection, then `afterHttp` (the components, in order).
 */
export function closeOnce(
  httpServer: Server,
  front: RawFront | null,
  beforeHttp: () => void,
  afterHttp: () => Promise<void>,
): () => Promise<void> {
  let closing: Promise<void> | null = null;
  return () => {
    closing ??= (async () => {
      beforeHttp();
      await new Promise<void>((resolve) => {
        httpServer.close(() => resolve());
        httpServer.closeAllConnections();
        front?.closeAll();
      });
      await afterHttp();
    })();
    return closing;
  };
}

export interface DrainParts {
  tracker: RequestTracker;
  httpServer: Server;
  /** The raw front, when on: its idle connections are closed as node's are. */
  front: RawFront | null;
  logger: Logger;
  /** The requests in flight, cut (an error event, a 503) when the grace period is over. */
  inFlight: ReadonlySet<RequestAbort> | undefined;
  /** Answers the requests still queued for admission (flow control) at once: a 503 to retry elsewhere. */
  closeQueue?: () => void;
  close: () => Promise<void>;
}

/**
 * Graceful stop (SIGTERM): stop accepting, answer /ready 503 and new requests 503 on
 * connections still open, let requests in flight (streams included) finish for up to
 * `graceMs`, then close. Resolves with how many requests were still running at the end.
 */
export function drainer(p: DrainParts): (graceMs: number) => Promise<number> {
  const { tracker, logger } = p;
  return async (graceMs) => {
    if (!tracker.draining) {
      tracker.draining = true;
      logger.info(
        { graceMs, active: tracker.active },
        "draining: not accepting, waiting for requests in flight",
      );
      // Stops the listener and closes idle keep-alive connections (Node >= 19).
      p.httpServer.close();
      p.front?.closeIdle();
      p.closeQueue?.();
      // A keep-alive connection with a request in flight gets its answer, then is closed:
      // `connection: close` on answers not started, an end after those already streaming.
      for (const res of tracker.open) {
        if (!res.headersSent) res.setHeader("connection", "close");
        else {
          // Taken now: by the time 'finish' listeners run, Node has detached it from `res`.
          const sock = res.socket;
          res.once("finish", () => sock?.end());
        }
      }
    }
    const deadline = Date.now() + graceMs;
    while (tracker.active > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    const left = tracker.active;
    if (left > 0) {
      logger.warn({ left, graceMs }, "drain: grace period over; cutting the requests in flight");
      // Each stream ends with an error event and [DONE], each unanswered request with a 503,
      // rather than a reset; a moment is left for those last writes before the sockets close.
      for (const a of p.inFlight ?? []) a.abort(new DrainCutError());
      const cutBy = Date.now() + 2000;
      while (tracker.active > 0 && Date.now() < cutBy) await new Promise((r) => setTimeout(r, 20));
    } else logger.info("drain: all requests finished");
    await p.close();
    return left;
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
