/**
 * The headroom contract of flow control (issue #29 items 1 and 4). The server's admission
 * queue (./queue.ts) asks a profile's headroom signals, before the scheduler runs, whether any
 * candidate worker can take the request now. When none can, the request waits in the server
 * (no headers sent) until a completion, an in-flight change or an engine-metrics scrape frees
 * headroom, or until its band's maximum wait.
 *
 * A signal is a plugin like the pipeline's filters and scorers: one file, one import line in
 * ./registry.ts, a `doc` line and zod params, registered under its name by `defineHeadroom`.
 * `load` (./load.ts) judges token load, engine queue and in-flight against thresholds;
 * `predicted-ttft` (lane F2) judges a predicted TTFT against the request's target. A profile
 * lists several; a candidate has headroom when EVERY listed signal says so (the strictest wins).
 */
import type { z } from "zod";
import type { Need } from "../pipeline/types.ts";
import type { TtftPredictor } from "../predict/ttft.ts";
import type { WorkerState } from "../types.ts";

/** What a signal is told about the request waiting for admission. */
export interface HeadroomRequest {
  readonly requestId: string;
  readonly model: string;
  /** Prompt tokens (exact when the server tokenized ahead, else an estimate from the text). */
  readonly promptTokens: number;
  /** Output tokens the request may produce (`max_tokens`/`max_completion_tokens`, else a default). */
  readonly expectedOutputTokens: number;
  /**
   * Prompt tokens not cached on each candidate (same positions as `candidates`), when the
   * server knows them (KV index or pending bridge); `undefined` for a position = unknown.
   */
  readonly uncachedTokens?: readonly (number | undefined)[];
  /**
   * The prompt's cached tokens on each of `candidates` (same positions; null: unknown), from the
   * model's routing policy (its kv-prefix overlap source), when it has one. A signal calls it
   * per check: the candidates change while a request waits.
   */
  readonly cachedTokens?: (candidates: readonly WorkerState[]) => readonly number[] | null;
  /** The request's band index (0 = highest) and name (config `flow.bands`). */
  readonly band: number;
  readonly bandName: string;
  /** vLLM's `priority` body field as the client sent it (lower = earlier), if any. */
  readonly priority?: number;
  /** TTFT target in ms (header `x-infera-ttft-target-ms`, else config per model/band), if any. */
  readonly targetTtftMs?: number;
}

/** A signal's answer for one request against its candidates. */
export interface HeadroomVerdict {
  /**
   * Positions (into the `candidates` given) that have headroom; empty = none has, the request
   * waits. A signal that cannot judge (no data yet) returns every position.
   */
  readonly fits: readonly number[];
  /** When `fits` is empty: the signal's estimate of ms until one candidate frees (Retry-After). */
  readonly waitMs?: number;
  /** Short machine-readable reason when nothing fits ("in-flight", "engine-queue", "ttft"). */
  readonly reason?: string;
}

/** A dispatched request's first token (a predictor learns from it then, not at the end). */
export interface HeadroomFirstToken {
  readonly requestId: string;
  readonly workerId: string;
  /** ms from dispatch to the first token. */
  readonly ttftMs: number;
}

/** What the server saw of a dispatched request (a predictor learns from these). */
export interface HeadroomObservation {
  readonly requestId: string;
  readonly workerId: string;
  readonly promptTokens: number;
  readonly uncachedTokens?: number;
  /** ms from dispatch to the first token, when the request got one. */
  readonly ttftMs?: number;
  readonly outputTokens?: number;
  /** ms from dispatch to the end of the answer. */
  readonly e2eMs: number;
  readonly ok: boolean;
}

export interface HeadroomSignal {
  readonly name: string;
  readonly needs: readonly Need[];
  /** Judges every candidate for `req`. Called on arrival and at each wake-up while queued: keep it cheap. */
  check(req: HeadroomRequest, candidates: readonly WorkerState[]): HeadroomVerdict;
  /** Told when a request left the queue for a worker. */
  onDispatched?(req: HeadroomRequest, worker: WorkerState): void;
  /**
   * Told at a dispatched request's first token. Under overload the end comes long after it (a
   * 64-token answer took 20–30 s wall behind a full batch in bench/fleet-routing Run K), so what
   * learns from TTFT should learn here.
   */
  onFirstToken?(o: HeadroomFirstToken): void;
  /** Told when a dispatched request ended (first token time included when it had one). */
  observe?(o: HeadroomObservation): void;
  onWorkerRemoved?(id: string): void;
}

/** Per-model state a signal may share (same shape as the pipeline's ModelScope.shared). */
export interface HeadroomScope {
  readonly model: string;
  /** The server's TTFT predictor (src/router/predict), shared with the pipeline's plugins. */
  readonly ttft?: TtftPredictor;
  /**
   * How many server replicas route to these engines, this one included: the peer plane's live
   * set when replicas share the scrape (src/router/peers/load-share.ts), else `flow.replicas`.
   */
  readonly replicas?: () => number;
  shared<T>(key: string, make: () => T): T;
}

interface HeadroomDef<S extends z.ZodTypeAny> {
  /** One line for the docs (docs/plugins.md is generated from it) and error messages. */
  readonly doc: string;
  readonly params: S;
  readonly needs: readonly Need[];
  create(scope: HeadroomScope, params: z.output<S>): HeadroomSignal;
}

/** A signal with its params type erased, as the registry holds it. */
export interface AnyHeadroomDef {
  readonly kind: "headroom";
  readonly doc: string;
  readonly params: z.ZodTypeAny;
  readonly needs: readonly Need[];
  /** Validates `params` (throws a ZodError) and builds the signal. */
  build(scope: HeadroomScope, params: unknown): HeadroomSignal;
}

/** Registered headroom signals by name (filled by the files ./registry.ts imports). */
export const headroomSignals = new Map<string, AnyHeadroomDef>();

/** Defines and registers a headroom signal under `name`. */
export function defineHeadroom<S extends z.ZodTypeAny>(name: string, d: HeadroomDef<S>): AnyHeadroomDef {
  if (headroomSignals.has(name)) throw new Error(`headroom signal '${name}' is registered twice`);
  const def: AnyHeadroomDef = {
    kind: "headroom",
    doc: d.doc,
    params: d.params,
    needs: d.needs,
    build: (scope, params) => d.create(scope, d.params.parse(params ?? {}) as z.output<S>),
  };
  headroomSignals.set(name, def);
  return def;
}

/**
 * The positions every signal lets through (intersection), and, when none, the smallest wait
 * any blocking signal estimated and the first blocking reason.
 */
export function combineVerdicts(
  signals: readonly HeadroomSignal[],
  req: HeadroomRequest,
  candidates: readonly WorkerState[],
): HeadroomVerdict {
  let fits: readonly number[] = candidates.map((_, i) => i);
  let waitMs: number | undefined;
  let reason: string | undefined;
  for (const s of signals) {
    if (fits.length === 0) break;
    const v = s.check(req, candidates);
    const allowed = new Set(v.fits);
    const next = fits.filter((i) => allowed.has(i));
    if (next.length === 0) {
      reason ??= v.reason ?? s.name;
      if (v.waitMs !== undefined) waitMs = waitMs === undefined ? v.waitMs : Math.min(waitMs, v.waitMs);
    }
    fits = next;
  }
  return fits.length > 0 ? { fits } : { fits, waitMs, reason };
}
