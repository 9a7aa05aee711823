import type {
  EndpointKind,
  RequestExecutor,
  SendOptions,
  UpstreamResponse,
  WorkerState,
} from "../../../src/router/types.ts";
import type { AbortLike } from "../../../src/util/abort.ts";

export interface Call {
  worker: string;
  endpoint: EndpointKind;
  body: Record<string, unknown>;
  opts: SendOptions;
  at: number;
}

export type Handler = (call: Call) => Promise<UpstreamResponse> | UpstreamResponse;

export function jsonAnswer(status: number, obj: unknown, onAbort?: () => void): UpstreamResponse {
  const bytes = new TextEncoder().encode(JSON.stringify(obj));
  return {
    status,
    headers: { "content-type": "application/json" },
    body: (async function* () {
      yield bytes;
    })(),
    json: async () => obj,
    abort: () => onAbort?.(),
  };
}

/** Resolves after `ms`, or rejects when the call's signal aborts first. */
export function delay(ms: number, signal: AbortLike): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      reject(signal.reason);
    });
  });
}

/** A RequestExecutor whose workers are scripted per id; records every call. */
export class FakeExecutor implements RequestExecutor {
  readonly handlers: Record<string, Handler>;
  readonly calls: Call[] = [];
  constructor(handlers: Record<string, Handler>) {
    this.handlers = handlers;
  }
  async send(w: WorkerState, endpoint: EndpointKind, body: Record<string, unknown>, opts: SendOptions) {
    const call = { worker: w.record.id, endpoint, body, opts, at: performance.now() };
    this.calls.push(call);
    const h = this.handlers[w.record.id];
    if (!h) throw new Error(`no handler for ${w.record.id}`);
    return h(call);
  }
  to(id: string): Call[] {
    return this.calls.filter((c) => c.worker === id);
  }
}
