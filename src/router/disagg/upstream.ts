/**
 * Helpers around `UpstreamResponse` for the DisaggRouter: reading an error answer's message,
 * draining a body nobody reads, and telling timeouts apart. (Claims on workers and failure
 * classification are the one dispatch path's: ../dispatch.ts, src/transport/types.ts.)
 */
import { InferaError, TimeoutError } from "../../protocol/errors.ts";
import type { UpstreamResponse } from "../../transport/types.ts";

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

export function isTimeout(err: unknown): boolean {
  return err instanceof TimeoutError || (err instanceof InferaError && err.status === 504);
}

export function describeError(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
