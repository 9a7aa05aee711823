/**
 * Transport-neutral failure classification shared by the request executors (HTTP, NATS)
 * and the MixedRouter: which failures are the worker's fault and may be retried elsewhere.
 */
import { UpstreamError } from "../protocol/errors.ts";

/** `connect`: nothing reached the worker (refused, unreachable); `reset`: it dropped the connection. */
export type ConnectionFailureKind = "connect" | "reset";

/** The worker could not be reached, or dropped the connection before the first response byte. */
export class WorkerUnreachableError extends UpstreamError {
  constructor(
    readonly url: string,
    readonly kind: ConnectionFailureKind,
    readonly detail: string,
  ) {
    super(`Worker ${url} is unreachable (${detail}).`, 502, "worker_unreachable");
  }
}

const CONNECT_CODES = new Set([
  "ECONNREFUSED",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "UND_ERR_CONNECT_TIMEOUT",
]);
const RESET_CODES = new Set(["ECONNRESET", "EPIPE", "ETIMEDOUT", "UND_ERR_SOCKET", "UND_ERR_CLOSED"]);

export function connectionFailureKind(err: unknown): ConnectionFailureKind | null {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined, depth = 0; e && depth < 4; depth++) {
    if (typeof e.code === "string") {
      if (CONNECT_CODES.has(e.code)) return "connect";
      if (RESET_CODES.has(e.code)) return "reset";
    }
    e = e.cause as typeof e;
  }
  return null;
}
