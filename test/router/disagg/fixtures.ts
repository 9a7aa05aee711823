import type { ConnectorInfo, WorkerRecord, WorkerRole } from "../../../src/discovery/types.ts";
import { makeDisaggRouterFactory } from "../../../src/router/disagg/index.ts";
import type { ModelRouter, RoutingPolicy, RoutingRequest, WorkerState } from "../../../src/router/types.ts";
import { createLogger } from "../../../src/util/log.ts";

export function record(
  id: string,
  role: WorkerRole,
  connector: ConnectorInfo,
  over: Partial<WorkerRecord> = {},
): WorkerRecord {
  return {
    id,
    model: "m",
    servedModelNames: ["m"],
    engine: "sim",
    role,
    url: `http://10.0.0.${id.length}:8000`,
    connector,
    blockSize: 16,
    dpSize: 1,
    tpSize: 1,
    dpRank: 0,
    maxModelLen: 4096,
    startedAt: "2026-01-01T00:00:00.000Z",
    ...over,
  };
}

export function state(rec: WorkerRecord, over: Partial<WorkerState> = {}): WorkerState {
  return { record: rec, inFlight: 0, pendingPrefillTokens: 0, available: true, ...over };
}

export function routingRequest(
  body: Record<string, unknown>,
  requestId = "req-0123456789abcdef0123456789abcdef",
): RoutingRequest {
  return {
    requestId,
    model: "m",
    endpoint: "chat",
    body,
    stream: body.stream === true,
    promptText: () => "hello",
    promptTokens: () => [1, 2, 3, 4, 5],
  };
}

/** Picks the first candidate (tests control the order), recording what it was offered. */
export function firstPolicy(): RoutingPolicy & { offered: string[][] } {
  const offered: string[][] = [];
  return {
    name: "first",
    offered,
    select(_req, cands) {
      offered.push(cands.map((c) => c.record.id));
      return { worker: cands[0], reason: "first" };
    },
  };
}

const silent = createLogger("test", {});
silent.level = "silent";

/** A disagg router with default options over these workers, taking the first P and D offered. */
export function firstPairRouter(ps: WorkerState[], ds: WorkerState[]): ModelRouter {
  return makeDisaggRouterFactory()({
    model: "m",
    prefillWorkers: () => ps,
    decodeWorkers: () => ds,
    policy: firstPolicy(),
    logger: silent,
    options: {},
  });
}
