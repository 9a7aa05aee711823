/**
 * Helpers around `UpstreamResponse` for the DisaggRouter: in-flight accounting that ends
 * exactly once however an answer ends, reading an error answer's message, draining a body
 * nobody reads, and classifying failures (only connection errors and 5xx count against a
 * worker, as the breaker expects).
 */
import { InferaError, TimeoutError } from "../../protocol/errors.ts";
import { connectionFailureKind, WorkerUnreachableError } from "../errors.ts";
import type { UpstreamResponse, WorkerState } from "../types.ts";

/**
 * One request's claim on a worker: counted in `inFlight` (and its prompt in
 * `pendingPrefillTokens`) from the moment the router picks it, so that concurrent picks see
 * it at once, until `release()` (idempotent).
 */
export class WorkerSlot {
  private released = false;

  constructor(
    readonly worker: WorkerState,
    private readonly prefillTokens = 0,
  ) {
    worker.inFlight++;
    worker.pendingPrefillTokens += prefillTokens;
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.worker.inFlight--;
    this.worker.pendingPrefillTokens -= this.prefillTokens;
  }
}

/** Holds `slot` until the answer's body ends, fails or is aborted; `onAbort` runs on abort. */
export function tracked(up: UpstreamResponse, slot: WorkerSlot, onAbort?: () => void): UpstreamResponse {
  const release = () => slot.release();
  const src = up.body;
  async function* body(): AsyncGenerator<Uint8Array> {
    try {
      for await (const chunk of src) yield chunk;
    } finally {
      release();
    }
  }
  return {
    status: up.status,
    headers: up.headers,
    body: body(),
    json: () => up.json().finally(release),
    abort: () => {
      up.abort();
      onAbort?.();
      release();
    },
  };
}

/** The `error.message` of an OpenAI-shaped error answer, else its status; consumes the body. */
export async function errorMessage(up: UpstreamResponse): Promise<string> {
  try {
    const j = (await up.json()) as { error?: { message?: unknown } } | null;
    if (j && typeof j.error?.message === "string") return j.error.message;
  } catch {
    // not JSON: the status says enough
  }
  return `HTTP ${up.status}`;
}

export async function drain(up: UpstreamResponse): Promise<void> {
  try {
    for await (const _ of up.body) {
      // discard: the prefill half's answer only matters for its status
    }
  } catch {
    // aborted or reset: nothing to keep
  }
}

export type FailureKind = "connect" | "reset" | "5xx" | null;

export function failureKind(err: unknown): FailureKind {
  if (err instanceof WorkerUnreachableError) return err.kind;
  if (err instanceof InferaError) return err.status >= 500 ? "5xx" : null;
  return connectionFailureKind(err);
}

export function isTimeout(err: unknown): boolean {
  return err instanceof TimeoutError || (err instanceof InferaError && err.status === 504);
}

export function describeError(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
