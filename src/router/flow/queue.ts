/**
 * The admission queue of one server replica (issue #29 items 1–3). A request that no candidate
 * has headroom for (./headroom.ts) waits here, holding no worker and having sent no headers,
 * until headroom frees; the server calls `wake()` on every event that can free it (a
 * dispatched request ended, the model's workers changed, an engine-metrics scrape came in), so
 * nothing polls.
 *
 * Order of dispatch, per pass:
 *   1. an entry that has waited past its band's `agingMs` goes first (oldest first): a lower
 *      band may be passed over, but not past that (no starvation);
 *   2. else the highest band (index 0) with entries;
 *   3. within a band, the backlogged flow with the smallest virtual token counter (VTC, Sheng
 *      et al., "Fairness in Serving Large Language Models", OSDI '24; AIBrix's vtc-basic
 *      router): a flow's counter grows by (prompt + expected output tokens) / weight at
 *      dispatch and is corrected by the real output at the end; a flow that becomes backlogged
 *      is lifted to the smallest counter of the band's backlogged flows, so idling earns no
 *      credit;
 *   4. FIFO within a flow;
 *   with locality (./locality.ts), an entry may be passed over for up to `locality.waitMs` for
 *   the busy worker holding its prefix, and of a look-ahead window in one band the one with
 *   the fewest uncached prompt tokens goes first.
 * One entry leaves per `setImmediate` turn: the server's router claims its worker (in-flight,
 * prefill backlog) synchronously after the entry's promise resumes, so the next headroom
 * check sees it.
 *
 * Bounds: `maxQueue` entries (a newcomer past it: 429 `queue_full`), each band's `maxWaitMs`
 * (429 `queue_timeout`), both with Retry-After; 503 when the model has no worker left. A
 * caller's abort removes its entry at once.
 */
import { NoWorkerError } from "../../protocol/errors.ts";
import type { AbortLike } from "../../util/abort.ts";
import type { RouteAdmission, WorkerState } from "../types.ts";
import { combineVerdicts, type HeadroomRequest, type HeadroomSignal } from "./headroom.ts";
import { FlowRejectedError } from "./limits.ts";
import {
  type CachedTokensOf,
  type LocalityConfig,
  type LocalityVerdict,
  localityVerdict,
} from "./locality.ts";

export interface BandSpec {
  readonly name: string;
  /** Past this wait a queued request is answered 429 `queue_timeout`. */
  readonly maxWaitMs: number;
  /** Past this wait a queued request is dispatched ahead of higher bands. */
  readonly agingMs: number;
}

/** What the queue reports (metrics, dashboard). All optional. */
export interface FlowObserver {
  onDispatched?(band: string, flow: string, waitedMs: number, queued: boolean): void;
  onRejected?(band: string, flow: string, reason: string): void;
  /**
   * Locality (./locality.ts), per request: `local` released where no worker holds notably more
   * of its prompt, `escaped` released elsewhere after its locality wait, `deferred` passed over
   * for it (counted once).
   */
  onLocality?(outcome: "local" | "escaped" | "deferred"): void;
}

export interface FlowQueueOptions {
  readonly bands: readonly BandSpec[];
  readonly maxQueue: number;
  /** The model's headroom signals (its profile's). */
  signals(model: string): readonly HeadroomSignal[];
  /** The model's available workers now; empty = none. */
  candidates(model: string): readonly WorkerState[];
  readonly observer?: FlowObserver;
  /** Locality (./locality.ts); absent or `waitMs` 0: off. */
  readonly locality?: LocalityConfig;
}

/** How a dispatched request ended, as the server saw it. */
export interface AdmissionEnd {
  readonly ok: boolean;
  readonly outputTokens?: number;
  /** ms from dispatch to the first token, when there was one. */
  readonly ttftMs?: number;
}

/**
 * A dispatched request's hold on the queue (the router reads it as `RoutingRequest.admission`):
 * told the worker the router picked and the end (VTC correction, signals, wake-up).
 */
export interface Admission extends RouteAdmission {
  readonly waitedMs: number;
  /** The answer's first token came `ttftMs` after dispatch (signals learn from it at once). */
  first(ttftMs: number): void;
  finish(end: AdmissionEnd): void;
}

interface Entry {
  readonly req: HeadroomRequest;
  readonly flow: string;
  readonly weight: number;
  readonly cost: number;
  readonly at: number;
  readonly resolve: (a: Admission) => void;
  readonly reject: (e: unknown) => void;
  timer: NodeJS.Timeout | null;
  unlisten: (() => void) | null;
  /** The prompt's cached tokens per candidate (locality), when the server can tell. */
  readonly cachedTokens?: CachedTokensOf;
  /** When locality first passed it over (its locality wait runs from here), and the wake-up timer. */
  localSince: number | null;
  localTimer: NodeJS.Timeout | null;
  /** The last `cachedTokens` answer and when (a pass looks at many entries; the index moves slowly). */
  seen: { at: number; of: readonly WorkerState[]; tokens: readonly number[] | null } | null;
}

/** How long an entry's cached-token reading is reused across passes, ms. */
const CACHED_READ_MS = 50;

function cachedOf(e: Entry, cands: readonly WorkerState[]): readonly number[] | null {
  const now = performance.now();
  const s = e.seen;
  if (s && s.of === cands && now - s.at < CACHED_READ_MS) return s.tokens;
  const tokens = e.cachedTokens ? e.cachedTokens(cands) : null;
  e.seen = { at: now, of: cands, tokens };
  return tokens;
}

interface Band {
  readonly spec: BandSpec;
  /** Backlogged flows' FIFOs. */
  readonly flows: Map<string, Entry[]>;
  /** VTC counters of flows seen in this band (bounded, see `trim`). */
  readonly counters: Map<string, number>;
}

const MAX_COUNTERS = 10_000;

export class FlowQueue {
  private readonly o: FlowQueueOptions;
  private readonly bands: Band[];
  private size = 0;
  private scheduled = false;

  constructor(o: FlowQueueOptions) {
    this.o = o;
    this.bands = o.bands.map((spec) => ({ spec, flows: new Map(), counters: new Map() }));
  }

  /** Entries waiting now. */
  get depth(): number {
    return this.size;
  }

  /**
   * Admits the request now when the model's queue is empty and a candidate has headroom, else
   * queues it. Rejects with FlowRejectedError (429), NoWorkerError (503) or the abort's reason.
   */
  admit(
    req: HeadroomRequest,
    flow: string,
    weightIn: number,
    signal: AbortLike,
    cachedTokens?: CachedTokensOf,
  ): Promise<Admission> {
    // A bad weight (0, NaN) would stall the VTC order (NaN compares false): count it as 1.
    const weight = Number.isFinite(weightIn) && weightIn > 0 ? weightIn : 1;
    const band = this.bands[req.band];
    if (!band) throw new RangeError(`no band ${req.band}`);
    if (signal.aborted) return Promise.reject(signal.reason);
    // No worker at all (every one out of rotation): 503 now, as without flow control.
    if (this.o.candidates(req.model).length === 0) {
      this.o.observer?.onRejected?.(band.spec.name, flow, "no_worker");
      return Promise.reject(new NoWorkerError(req.model));
    }
    let deferred = false;
    if (!this.hasQueued(req.model)) {
      const fits = this.fits(req);
      if (fits.size > 0) {
        const v = this.verdict(req.model, fits, cachedTokens, false);
        if (v) {
          if (this.o.locality && this.o.locality.waitMs > 0 && cachedTokens)
            this.o.observer?.onLocality?.("local");
          return Promise.resolve(this.dispatched(req, flow, weight, this.costOf(req), 0, v.fits));
        }
        deferred = true;
      }
    }
    if (this.size >= this.o.maxQueue) {
      this.o.observer?.onRejected?.(band.spec.name, flow, "queue_full");
      return Promise.reject(
        new FlowRejectedError(
          "queue_full",
          `The server's queue is full (${this.o.maxQueue}); retry later.`,
          1,
        ),
      );
    }
    return new Promise<Admission>((resolve, reject) => {
      const e: Entry = {
        req,
        flow,
        weight,
        cost: this.costOf(req),
        at: performance.now(),
        resolve,
        reject,
        timer: null,
        unlisten: null,
        cachedTokens,
        localSince: null,
        localTimer: null,
        seen: null,
      };
      this.enqueue(band, e);
      e.timer = setTimeout(() => this.expire(band, e), band.spec.maxWaitMs);
      if (deferred) this.deferLocal(e, e.at);
      const onAbort = (): void => {
        if (!this.remove(band, e)) return;
        this.o.observer?.onRejected?.(band.spec.name, flow, "cancelled");
        reject(signal.reason);
        this.wake();
      };
      signal.addEventListener("abort", onAbort);
      e.unlisten = () => signal.removeEventListener("abort", onAbort);
      // Headroom can come back without an event (a stale engine reading ages out): every
      // arrival also checks the queue once.
      this.wake();
    });
  }

  /** Headroom may have freed: schedule a dispatch pass (at most one pending). */
  wake(): void {
    if (this.scheduled || this.size === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.pass();
    });
  }

  /** Answers every queued request with `err` (drain, shutdown). */
  close(err: unknown): void {
    for (const b of this.bands)
      for (const q of [...b.flows.values()]) for (const e of [...q]) if (this.remove(b, e)) e.reject(err);
  }

  /** Queue depth per band and flow, and each band's oldest wait (ms), for the dashboard. */
  snapshot(): {
    band: string;
    flows: { flow: string; depth: number; counter: number }[];
    oldestMs: number;
  }[] {
    const now = performance.now();
    return this.bands.map((b) => {
      let oldest = 0;
      const flows = [...b.flows].map(([flow, q]) => {
        if (q.length > 0) oldest = Math.max(oldest, now - q[0].at);
        return { flow, depth: q.length, counter: Math.round(b.counters.get(flow) ?? 0) };
      });
      return { band: b.spec.name, flows, oldestMs: Math.round(oldest) };
    });
  }

  private costOf(req: HeadroomRequest): number {
    return req.promptTokens + req.expectedOutputTokens;
  }

  private fits(req: HeadroomRequest): Set<string> {
    const cands = this.o.candidates(req.model);
    const v = combineVerdicts(this.o.signals(req.model), req, cands);
    return new Set(v.fits.map((i) => cands[i].record.id));
  }

  private hasQueued(model: string): boolean {
    if (this.size === 0) return false;
    for (const b of this.bands)
      for (const q of b.flows.values()) if (q.some((e) => e.req.model === model)) return true;
    return false;
  }

  private enqueue(b: Band, e: Entry): void {
    let q = b.flows.get(e.flow);
    if (!q) {
      // VTC's lift: a flow that was idle starts at the smallest backlogged counter.
      let min = Number.POSITIVE_INFINITY;
      for (const f of b.flows.keys()) min = Math.min(min, b.counters.get(f) ?? 0);
      const own = b.counters.get(e.flow) ?? 0;
      b.counters.set(e.flow, Number.isFinite(min) ? Math.max(own, min) : own);
      q = [];
      b.flows.set(e.flow, q);
    }
    q.push(e);
    this.size++;
  }

  /** Takes `e` out; false when it had left already. */
  private remove(b: Band, e: Entry): boolean {
    const q = b.flows.get(e.flow);
    const i = q ? q.indexOf(e) : -1;
    if (!q || i < 0) return false;
    q.splice(i, 1);
    if (q.length === 0) b.flows.delete(e.flow);
    this.size--;
    if (e.timer) clearTimeout(e.timer);
    if (e.localTimer) clearTimeout(e.localTimer);
    e.unlisten?.();
    return true;
  }

  private expire(b: Band, e: Entry): void {
    if (!this.remove(b, e)) return;
    const cands = this.o.candidates(e.req.model);
    if (cands.length === 0) {
      this.o.observer?.onRejected?.(b.spec.name, e.flow, "no_worker");
      e.reject(new NoWorkerError(e.req.model));
      return;
    }
    this.o.observer?.onRejected?.(b.spec.name, e.flow, "queue_timeout");
    const wait = combineVerdicts(this.o.signals(e.req.model), e.req, cands).waitMs ?? 1000;
    e.reject(
      new FlowRejectedError(
        "queue_timeout",
        `No worker had headroom within ${b.spec.maxWaitMs} ms; retry later.`,
        Math.max(1, Math.ceil(wait / 1000)),
      ),
    );
    this.wake();
  }

  /**
   * Locality's verdict for a request whose headroom verdict is `fits` (./locality.ts): where to
   * release it, or null to pass it over for now. `expired`: its locality wait is over.
   */
  private verdict(
    model: string,
    fits: ReadonlySet<string>,
    cachedTokens: CachedTokensOf | undefined,
    expired: boolean,
    e?: Entry,
  ): LocalityVerdict {
    const cfg = this.o.locality;
    if (!cfg || cfg.waitMs <= 0 || !cachedTokens) return { fits, local: true, cached: null };
    const cands = this.o.candidates(model);
    // Every candidate has headroom: nothing to wait for, and the scheduler chooses as without
    // flow control (its hot-prefix spreading included); no index lookup on the unsaturated path.
    if (fits.size >= cands.length) return { fits, local: true, cached: null };
    return localityVerdict(cfg, fits, cands, e ? cachedOf(e, cands) : cachedTokens(cands), expired);
  }

  /** Starts `e`'s locality wait (once): a wake-up when it runs out, as no event may come then. */
  private deferLocal(e: Entry, now: number): void {
    if (e.localSince !== null) return;
    this.o.observer?.onLocality?.("deferred");
    e.localSince = now;
    e.localTimer = setTimeout(() => this.wake(), (this.o.locality?.waitMs ?? 0) + 1);
  }

  /**
   * Dispatches one entry that fits, then schedules the next pass. Without locality: the first in
   * order. With it (./locality.ts): the first in order that is past its band's aging or its
   * locality wait; else, of up to `lookahead` entries in order, those that need not wait for a
   * busy worker holding more of their prompt, and among them (`pick: cheapest`) the one with the
   * fewest uncached prompt tokens on the workers it may go to, or (`pick: first`) the first.
   * Every entry passed over starts its locality wait, so none is passed over longer than that.
   */
  private pass(): void {
    // Per model, the highest band (lowest index) whose entry found no headroom this pass.
    const blocked = new Map<string, number>();
    const skipped = new Set<Entry>();
    const cfg = this.o.locality;
    const on = cfg !== undefined && cfg.waitMs > 0;
    const ready: Array<{ b: Band; e: Entry; v: NonNullable<LocalityVerdict> }> = [];
    const now = performance.now();
    for (;;) {
      const pick = this.next(blocked, skipped);
      if (!pick) break;
      const [b, e] = pick;
      if (this.o.candidates(e.req.model).length === 0) {
        this.remove(b, e);
        this.o.observer?.onRejected?.(b.spec.name, e.flow, "no_worker");
        e.reject(new NoWorkerError(e.req.model));
        continue;
      }
      const fits = this.fits(e.req);
      if (fits.size === 0) {
        // Strict order within a model: nothing of this band or a lower one goes first. A
        // higher band may: signals can hold a lower band to tighter bounds (load's `bands`),
        // so an aged low entry that does not fit must not stall a high one that does.
        blocked.set(e.req.model, Math.min(e.req.band, blocked.get(e.req.model) ?? e.req.band));
        continue;
      }
      // Not the band's aging: under saturation every entry outlives it, and locality would be off
      // exactly when it pays. An aged entry still comes first in order and waits waitMs at most.
      const expired = e.localSince !== null && now - e.localSince >= (cfg?.waitMs ?? 0);
      const v = this.verdict(e.req.model, fits, e.cachedTokens, expired, e);
      // Unknown cache (no prefix policy) or no choice to make: in order.
      if (v && (expired || !on || cfg.pick === "first" || v.cached === null)) {
        this.release(b, e, v, now);
        return;
      }
      // The cheapest is chosen within one band: a lower band never goes first for being cheap.
      if (v && ready.length > 0 && ready[0].b !== b) break;
      skipped.add(e);
      if (v) ready.push({ b, e, v });
      else this.deferLocal(e, now);
      // The window is spent: a free worker nobody in it wants waits for the next event (a
      // deferred entry's wait running out is one).
      if (skipped.size >= (cfg?.lookahead ?? 1)) break;
    }
    if (ready.length === 0) return;
    const uncached = (x: (typeof ready)[number]) => Math.max(0, x.e.req.promptTokens - (x.v.cached ?? 0));
    let k = 0;
    for (let i = 1; i < ready.length; i++) if (uncached(ready[i]) < uncached(ready[k])) k = i;
    for (let i = 0; i < k; i++) this.deferLocal(ready[i].e, now);
    this.release(ready[k].b, ready[k].e, ready[k].v, now);
  }

  private release(b: Band, e: Entry, v: NonNullable<LocalityVerdict>, now: number): void {
    this.remove(b, e);
    if (this.o.locality && this.o.locality.waitMs > 0 && e.cachedTokens)
      this.o.observer?.onLocality?.(v.local ? "local" : "escaped");
    e.resolve(this.dispatched(e.req, e.flow, e.weight, e.cost, now - e.at, v.fits, b));
    this.wake();
  }

  /**
   * The entry to try next, skipping `skipped` entries and those of `blocked` models at or below
   * the band that was blocked: aged first, then band, VTC, FIFO.
   */
  private next(blocked: ReadonlyMap<string, number>, skipped: ReadonlySet<Entry>): [Band, Entry] | null {
    const now = performance.now();
    const skip = (e: Entry): boolean =>
      skipped.has(e) || e.req.band >= (blocked.get(e.req.model) ?? Number.POSITIVE_INFINITY);
    let aged: [Band, Entry] | null = null;
    for (const b of this.bands)
      for (const q of b.flows.values())
        for (const e of q) {
          if (skip(e) || now - e.at < b.spec.agingMs) continue;
          if (!aged || e.at < aged[1].at) aged = [b, e];
        }
    if (aged) return aged;
    for (const b of this.bands) {
      let best: Entry | null = null;
      let bestC = Number.POSITIVE_INFINITY;
      for (const [flow, q] of b.flows) {
        const e = q.find((x) => !skip(x));
        if (!e) continue;
        const c = b.counters.get(flow) ?? 0;
        if (c < bestC || (c === bestC && best !== null && e.at < best.at)) {
          best = e;
          bestC = c;
        }
      }
      if (best) return [b, best];
    }
    return null;
  }

  private dispatched(
    req: HeadroomRequest,
    flow: string,
    weight: number,
    cost: number,
    waitedMs: number,
    fits: ReadonlySet<string>,
    band: Band = this.bands[req.band],
  ): Admission {
    const c = band.counters;
    c.set(flow, (c.get(flow) ?? 0) + cost / weight);
    if (c.size > MAX_COUNTERS) trim(band);
    this.o.observer?.onDispatched?.(band.spec.name, flow, waitedMs, waitedMs > 0);
    const signals = this.o.signals(req.model);
    const at = performance.now();
    let worker: WorkerState | null = null;
    let done = false;
    return {
      waitedMs,
      fits,
      routed: (w) => {
        worker = w;
        for (const s of signals) s.onDispatched?.(req, w);
      },
      first: (ttftMs) => {
        if (done || !worker) return;
        const o = { requestId: req.requestId, workerId: worker.record.id, ttftMs };
        for (const s of signals) s.onFirstToken?.(o);
      },
      finish: (end) => {
        if (done) return;
        done = true;
        const out = end.outputTokens;
        if (out !== undefined && c.has(flow)) {
          c.set(flow, Math.max(0, (c.get(flow) ?? 0) + (out - req.expectedOutputTokens) / weight));
        }
        if (worker) {
          const o = {
            requestId: req.requestId,
            workerId: worker.record.id,
            promptTokens: req.promptTokens,
            ttftMs: end.ttftMs,
            outputTokens: out,
            e2eMs: performance.now() - at,
            ok: end.ok,
          };
          for (const s of signals) s.observe?.(o);
        }
        this.wake();
      },
    };
  }
}

/** Drops the counters of flows not backlogged (they are lifted again when they come back). */
function trim(b: Band): void {
  for (const f of b.counters.keys()) if (!b.flows.has(f)) b.counters.delete(f);
}
