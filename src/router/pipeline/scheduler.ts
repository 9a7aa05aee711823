/**
 * The Scheduler: one per model, built from three step profiles (mixed, prefill, decode). It is
 * the `RoutingPolicy` the routers call: `select` runs the mixed step, `step("prefill")` and
 * `step("decode")` are the PD steps (disagg/select.ts). State shared across steps (the
 * round-robin turn, the prefill ledger, prefix trees) lives in the model scope, so a model that
 * switches between mixed and PD routing keeps one history, as a single policy instance did.
 */

import type { PrefixIndex } from "../../kv/prefix-index.ts";
import type { Logger } from "../../util/log.ts";
import type { PeerRouting } from "../peers/types.ts";
import type { TtftPredictor } from "../predict/ttft.ts";
import type { RouteLifecycle, RoutingPolicy, RoutingRequest, Selection, WorkerState } from "../types.ts";
import { type DecisionLog, type DecisionRecord, explain } from "./decisions.ts";
import type { BridgeCounters } from "./pending-prefixes.ts";
import { filters as filterDefs, pickers as pickerDefs, scorers as scorerDefs } from "./registry.ts";
import { RowArena } from "./rows.ts";
import type {
  Filter,
  ModelScope,
  OverlapResult,
  OverlapSource,
  Picker,
  ProfileSet,
  ProfileSpec,
  Scorer,
  Step,
  StepContext,
} from "./types.ts";
import { candidateView, requestLoad } from "./util.ts";

export interface SchedulerStats {
  /** Decisions by reason. */
  decisions: Record<string, number>;
  /** Sum of the chosen workers' cached blocks and of the prompts' blocks (overlap-aware steps). */
  overlapBlocks: number;
  promptBlocks: number;
  /** The model's pending bridges' counters (usually one), read at scrape time. */
  bridges: Readonly<BridgeCounters>[];
}

export interface SchedulerOptions {
  /** The policy (preset) name: metrics label and logs. */
  name: string;
  model: string;
  logger: Logger;
  kvIndex?: PrefixIndex;
  /** Peer replicas' routed prefixes (ModelScope.peers). */
  peers?: PeerRouting;
  /** The server's TTFT predictor (ModelScope.ttft). */
  ttft?: TtftPredictor;
  profiles: ProfileSet;
  /** Where decisions are explained (the server's ring buffer). */
  decisions?: DecisionLog;
}

/**
 * Cached [0, 1, …, n−1] rows (never written: filters return new arrays). Not frozen: V8 reads a
 * frozen array's elements on a slower path (src/util/stable-lists.ts), and every plugin loops
 * over these.
 */
const identities: (readonly number[])[] = [];
/** Past 256 workers only the last size is kept: a fleet's size changes seldom, and one row per
 *  size seen would keep every size a growing fleet passed through. */
let bigIdentity: readonly number[] = [];
function identity(n: number): readonly number[] {
  if (n >= 256) {
    if (bigIdentity.length !== n) bigIdentity = Array.from({ length: n }, (_, i) => i);
    return bigIdentity;
  }
  identities[n] ??= Array.from({ length: n }, (_, i) => i);
  return identities[n];
}

/** Cached zero totals for steps without scorers (never written). */
const zeroRows: Float64Array[] = [];
let bigZeros = new Float64Array(0);
function zeros(n: number): Float64Array {
  if (n >= 256) {
    if (bigZeros.length !== n) bigZeros = new Float64Array(n);
    return bigZeros;
  }
  zeroRows[n] ??= new Float64Array(n);
  return zeroRows[n];
}

/** The KV index's per-candidate rows of one decision (PrefixIndex.candidateRows). */
export interface IndexRows {
  blockSize: Int32Array;
  /** −1 where the index does not track the worker in sync. */
  held: Int32Array;
  /** 0 not tracked, 1 syncing, 2 synced, 3 unknown. */
  sync: Uint8Array;
}

const EMPTY_OVERLAPS: OverlapResult = { overlaps: new Int32Array(0), ranks: new Int32Array(0) };

class Ctx implements StepContext {
  readonly req: RoutingRequest;
  readonly step: Step;
  readonly scope: ModelScope;
  readonly all: readonly WorkerState[];
  readonly rows: RowArena;
  private readonly source: OverlapSource | undefined;
  private readonly heldOf: ((id: string) => number) | undefined;
  reason?: string;
  winner = -1;
  private ov: OverlapResult | null = null;
  private bs: Int32Array | null = null;
  private ld: Float64Array | null = null;
  private hd: Float64Array | null = null;
  private pb: Int32Array | null = null;
  private idxRows: IndexRows | null | undefined = undefined;
  /** `held` reads the index's count where it tracks the worker (see OverlapSource.heldFromIndex). */
  private readonly heldFromIndex: boolean;

  constructor(
    req: RoutingRequest,
    step: Step,
    scope: ModelScope,
    all: readonly WorkerState[],
    source: OverlapSource | undefined,
    heldOf: ((id: string) => number) | undefined,
    rows: RowArena,
  ) {
    this.req = req;
    this.step = step;
    this.scope = scope;
    this.all = all;
    this.rows = rows;
    this.source = source;
    this.heldOf = heldOf;
    // Without a view of its own the step reads the index's counts (the `else` in `held`).
    this.heldFromIndex = heldOf === undefined || source?.heldFromIndex === true;
  }

  private computeOverlaps() {
    if (this.ov) return this.ov;
    if (this.source) this.ov = this.source.overlaps(this);
    else {
      const n = this.all.length;
      this.ov = n === 0 ? EMPTY_OVERLAPS : { overlaps: this.rows.i32(n), ranks: this.rows.i32(n).fill(-1) };
    }
    return this.ov;
  }

  overlaps(): Int32Array {
    return this.computeOverlaps().overlaps;
  }

  ranks(): Int32Array {
    return this.computeOverlaps().ranks;
  }

  bridged(): Int32Array | null {
    return this.computeOverlaps().bridged ?? null;
  }

  // The per-candidate rows below are filled with plain loops: `TypedArray.from(list, fn)` goes
  // through the iterator protocol and a call per element, several times slower at 256 workers.
  blockSize(pos: number): number {
    if (!this.bs) {
      const idx = this.scope.kvIndex;
      const all = this.all;
      const bs = this.rows.i32(all.length);
      const rows = this.indexRows();
      for (let i = 0; i < all.length; i++) {
        const r = all[i].record;
        const known = rows ? rows.blockSize[i] || undefined : idx?.blockSizeOf(r.id);
        bs[i] = known ?? (r.blockSize > 0 ? r.blockSize : 16);
      }
      this.bs = bs;
    }
    return this.bs[pos];
  }

  /** The index's block size, held blocks and sync per candidate, in one pass (null: no index or no bulk read). */
  indexRows(): IndexRows | null {
    if (this.idxRows === undefined) {
      const idx = this.scope.kvIndex;
      if (!idx?.candidateRows) this.idxRows = null;
      else {
        const n = this.all.length;
        const rows: IndexRows = {
          blockSize: this.rows.i32(n),
          held: this.rows.i32(n),
          sync: this.rows.u8(n),
        };
        idx.candidateRows(candidateView(this.all).ids, rows.blockSize, rows.held, rows.sync);
        this.idxRows = rows;
      }
    }
    return this.idxRows;
  }

  promptBlocks(pos: number): number {
    return this.promptBlocksRow()[pos];
  }

  promptBlocksRow(): Int32Array {
    // Read by several plugins for every candidate: one row per decision.
    if (!this.pb) {
      const len = this.req.promptTokens().length;
      const n = this.all.length;
      const pb = this.rows.i32(n);
      this.blockSize(0);
      const bs = this.bs!;
      for (let i = 0; i < n; i++) pb[i] = Math.floor(len / bs[i]);
      this.pb = pb;
    }
    return this.pb;
  }

  held(pos: number): number {
    // Read by cache-pressure for every candidate and by argmin's ties: once per position, and
    // the index's counts for all candidates at once where it tracks them in sync.
    if (!this.hd) {
      const hd = this.rows.f64(this.all.length).fill(-1);
      const rows = this.heldFromIndex ? this.indexRows() : null;
      if (rows) for (let i = 0; i < hd.length; i++) if (rows.held[i] >= 0) hd[i] = rows.held[i];
      this.hd = hd;
    }
    let h = this.hd[pos];
    if (h < 0) {
      const id = this.all[pos].record.id;
      if (this.heldOf) h = this.heldOf(id);
      else {
        const idx = this.scope.kvIndex;
        h = idx?.hasWorker(id) ? idx.blockCount(id) : 0;
      }
      this.hd[pos] = h;
    }
    return h;
  }

  loads(): Float64Array {
    if (!this.ld) {
      const all = this.all;
      const ld = this.rows.f64(all.length);
      for (let i = 0; i < all.length; i++) ld[i] = requestLoad(all[i]);
      this.ld = ld;
    }
    return this.ld;
  }
}

/** One step's pipeline as a RoutingPolicy. */
export class StepPolicy implements RoutingPolicy {
  readonly name: string;
  readonly step: Step;
  private readonly scope: ModelScope;
  private readonly stats: SchedulerStats;
  private readonly log: DecisionLog | undefined;
  readonly filters: Filter[];
  readonly scorers: Scorer[];
  readonly weights: number[];
  readonly scorerNames: string[];
  readonly picker: Picker;
  private readonly source: OverlapSource | undefined;
  private readonly heldOf: ((id: string) => number) | undefined;
  /** The last decision (onRouted follows select for the same request). */
  last: Ctx | null = null;

  constructor(
    name: string,
    step: Step,
    scope: ModelScope,
    spec: ProfileSpec,
    stats: SchedulerStats,
    log: DecisionLog | undefined,
  ) {
    this.name = name;
    this.step = step;
    this.scope = scope;
    this.stats = stats;
    this.log = log;
    this.filters = (spec.filters ?? []).map((f) =>
      build(filterDefs, "filter", f.name).build(scope, f.params),
    );
    this.scorers = spec.scorers.map((s) => build(scorerDefs, "scorer", s.name).build(scope, s.params));
    this.weights = spec.scorers.map((s) => s.weight);
    this.scorerNames = spec.scorers.map((s) => s.name);
    this.picker = build(pickerDefs, "picker", spec.picker.name).build(scope, spec.picker.params);
    this.source = this.scorers.find((s) => s.overlapSource)?.overlapSource;
    const view = this.source ?? this.scorers.find((s) => s.cacheView)?.cacheView;
    this.heldOf = view ? (id) => view.held(id) : undefined;
  }

  /**
   * Two arenas, alternated decision by decision, so the last decision's rows stay intact while
   * the next one runs (./rows.ts); a third for the side questions (`cachedTokens`, `explain`),
   * whose rows are copied before they return.
   */
  private readonly arenas = [new RowArena(), new RowArena()];
  private turn = 0;
  private readonly sideRows = new RowArena();

  private nextArena(): RowArena {
    this.turn ^= 1;
    const a = this.arenas[this.turn];
    a.reset();
    return a;
  }

  private side(): RowArena {
    this.sideRows.reset();
    return this.sideRows;
  }

  /** Runs the pipeline; returns the context with `winner` set (a position in `all`). */
  decide(req: RoutingRequest, all: readonly WorkerState[]): Ctx {
    const ctx = new Ctx(req, this.step, this.scope, all, this.source, this.heldOf, this.nextArena());
    let at: readonly number[] = identity(all.length);
    for (const f of this.filters) {
      const kept = f.filter(ctx, at);
      // A filter that would leave nothing is ignored: the step must still choose.
      if (kept.length > 0) at = kept;
    }
    // A filter's reason (the guard's "load-balance") names the decision, whatever the picker says.
    const filterReason = ctx.reason;
    const n = at.length;
    const ns = this.scorers.length;
    // No scorers (round-robin, least-load): a shared read-only zero row, nothing allocated.
    // Otherwise the totals (n) and per-scorer values (ns × n) are rows of this decision
    // (ctx.rows): the decision log and traces copy them.
    const totals = ns > 0 ? ctx.rows.f64(n) : zeros(n);
    const values = ns > 0 ? ctx.rows.f64(n * ns) : null;
    for (let s = 0; s < ns; s++) {
      const out = values!.subarray(s * n, (s + 1) * n);
      this.scorers[s].score(ctx, at, this.weights[s], out);
      for (let k = 0; k < n; k++) totals[k] += out[k];
    }
    const k = this.picker.pick(ctx, at, totals);
    ctx.winner = at[k];
    if (filterReason !== undefined) ctx.reason = filterReason;
    else if (ctx.reason === undefined)
      ctx.reason = this.source ? (ctx.overlaps()[ctx.winner] > 0 ? "overlap" : "load") : "score";
    req.trace?.scores(this.step, all, at, this.scorerNames, values, totals);
    this.log?.record(
      req.requestId,
      this.scope.model,
      this.step,
      all,
      at,
      this.scorerNames,
      values,
      totals,
      ctx.winner,
      ctx.reason,
      this.source ? ctx : null,
      this.source ? (ctx.indexRows()?.sync ?? null) : null,
    );
    if (this.scope.logger.isLevelEnabled("debug")) {
      const r: DecisionRecord = {
        requestId: req.requestId,
        model: this.scope.model,
        step: this.step,
        all,
        kept: at,
        scorerNames: this.scorerNames,
        values,
        totals,
        winner: ctx.winner,
        reason: ctx.reason,
        cached: this.source ? ctx.overlaps() : null,
        bridged: this.source ? ctx.bridged() : null,
        promptBlocks: this.source ? Int32Array.from(all, (_, i) => ctx.promptBlocks(i)) : null,
      };
      this.scope.logger.debug({ decision: explain(r) }, "scheduling decision");
    }
    return ctx;
  }

  select(req: RoutingRequest, candidates: readonly WorkerState[]): Selection {
    const t0 = performance.now();
    const ctx = this.decide(req, candidates);
    this.last = ctx;
    const i = ctx.winner;
    const worker = candidates[i];
    const reason = ctx.reason!;
    this.stats.decisions[reason] = (this.stats.decisions[reason] ?? 0) + 1;
    if (!this.source) return { worker, reason, seconds: (performance.now() - t0) / 1000 };
    const overlap = ctx.overlaps()[i];
    const blocks = ctx.promptBlocks(i);
    this.stats.overlapBlocks += overlap;
    this.stats.promptBlocks += blocks;
    this.scope.kvIndex?.decisionObserver?.(reason, overlap, blocks);
    const dpRank = pinnedRank(worker, overlap, ctx.ranks()[i]);
    const seconds = (performance.now() - t0) / 1000;
    return dpRank === undefined
      ? { worker, overlapBlocks: overlap, reason, seconds }
      : { worker, overlapBlocks: overlap, reason, dpRank, seconds };
  }

  onRouted(req: RoutingRequest, worker: WorkerState, route?: RouteLifecycle): void {
    const ctx = this.last?.req.requestId === req.requestId ? this.last : null;
    for (const f of this.filters) f.onRouted?.(req, worker, ctx, route);
    for (const s of this.scorers) s.onRouted?.(req, worker, ctx, route);
    this.source?.onRouted?.(req, worker, route);
    this.picker.onRouted?.(req, worker);
    this.last = null;
  }

  onWorkerRemoved(id: string): void {
    for (const f of this.filters) f.onWorkerRemoved?.(id);
    for (const s of this.scorers) s.onWorkerRemoved?.(id);
    this.source?.onWorkerRemoved?.(id);
    this.picker.onWorkerRemoved?.(id);
  }

  /** Per candidate: cached prompt tokens from the step's overlap source (null without one); records nothing. */
  cachedTokens(req: RoutingRequest, candidates: readonly WorkerState[]): number[] | null {
    if (!this.source) return null;
    const ctx = new Ctx(req, this.step, this.scope, candidates, this.source, this.heldOf, this.side());
    const ov = ctx.overlaps();
    return Array.from(candidates, (_, i) => ov[i] * ctx.blockSize(i));
  }

  /** Per candidate: overlap blocks and total cost, without recording a decision (tests, logs). */
  explain(req: RoutingRequest, candidates: readonly WorkerState[]): { overlaps: number[]; costs: number[] } {
    const ctx = new Ctx(req, this.step, this.scope, candidates, this.source, this.heldOf, this.side());
    const at = candidates.map((_, i) => i);
    const costs = new Float64Array(at.length);
    const out = new Float64Array(at.length);
    this.scorers.forEach((s, si) => {
      s.score(ctx, at, this.weights[si], out);
      for (let k = 0; k < at.length; k++) costs[k] += out[k];
    });
    return { overlaps: Array.from(ctx.overlaps()), costs: Array.from(costs) };
  }
}

function build<T>(
  defs: ReadonlyMap<string, { build(scope: ModelScope, params: unknown): T }>,
  kind: string,
  name: string,
) {
  const d = defs.get(name);
  if (!d) throw new Error(`unknown ${kind} '${name}' (known: ${[...defs.keys()].join(", ")})`);
  return d;
}

/** The rank to pin on a vLLM DP worker whose best rank holds part of the prompt. */
function pinnedRank(c: WorkerState, overlap: number, rank: number): number | undefined {
  if (overlap <= 0 || rank < 0 || c.record.engine !== "vllm") return undefined;
  // Only a worker that fronts several ranks (its record lists them): a record per rank (vLLM
  // external load balancing) serves one rank, and a header naming another would be wrong.
  return (c.record.kvEvents?.ranks?.length ?? 0) > 1 ? rank : undefined;
}

/** A model's scheduler: the mixed step as `select`, the PD steps through `step()`. */
export class Scheduler implements RoutingPolicy {
  readonly name: string;
  readonly stats: SchedulerStats = { decisions: {}, overlapBlocks: 0, promptBlocks: 0, bridges: [] };
  private readonly closers: (() => void)[] = [];
  private readonly steps: Record<Step, StepPolicy>;
  /** The step whose select ran last for a request (onRouted goes there). */
  private lastRouted: { requestId: string; step: StepPolicy } | null = null;

  constructor(o: SchedulerOptions) {
    this.name = o.name;
    const shared = new Map<string, unknown>();
    const { closers, stats } = this;
    const scope: ModelScope = {
      model: o.model,
      logger: o.logger,
      kvIndex: o.kvIndex,
      peers: o.peers,
      ttft: o.ttft,
      shared<T>(key: string, make: () => T): T {
        let v = shared.get(key) as T | undefined;
        if (v === undefined) {
          v = make();
          shared.set(key, v);
        }
        return v;
      },
      onClose: (fn) => closers.push(fn),
      reportBridge: (c) => stats.bridges.push(c),
    };
    const mk = (s: Step) => new StepPolicy(o.name, s, scope, o.profiles[s], this.stats, o.decisions);
    this.steps = { mixed: mk("mixed"), prefill: mk("prefill"), decode: mk("decode") };
  }

  step(s: Step): StepPolicy {
    return this.steps[s];
  }

  select(req: RoutingRequest, candidates: readonly WorkerState[]): Selection {
    return this.selectFor("mixed", req, candidates);
  }

  /** Runs one step; `onRouted` after it reaches that step's plugins. */
  selectFor(s: Step, req: RoutingRequest, candidates: readonly WorkerState[]): Selection {
    const p = this.steps[s];
    const sel = p.select(req, candidates);
    this.lastRouted = { requestId: req.requestId, step: p };
    return sel;
  }

  /** The mixed step's view of each candidate's cached prompt tokens (flow control's locality). */
  cachedTokens(req: RoutingRequest, candidates: readonly WorkerState[]): number[] | null {
    return this.steps.mixed.cachedTokens(req, candidates);
  }

  onRouted(req: RoutingRequest, worker: WorkerState, route?: RouteLifecycle): void {
    const p = this.lastRouted?.requestId === req.requestId ? this.lastRouted.step : this.steps.mixed;
    this.lastRouted = null;
    p.onRouted(req, worker, route);
  }

  onWorkerRemoved(id: string): void {
    this.steps.mixed.onWorkerRemoved(id);
    this.steps.prefill.onWorkerRemoved(id);
    this.steps.decode.onWorkerRemoved(id);
  }

  /**
   * Lets go of what outlives the scheduler (the KV index's removal listeners): a server that
   * closes its router, or rebuilds a model's policy, would otherwise keep every old one alive.
   */
  close(): void {
    for (const fn of this.closers.splice(0)) fn();
  }

  /** Sum of the model's pending bridges' counters (for /metrics). */
  bridgeCounters(): Record<string, number> | undefined {
    if (this.stats.bridges.length === 0) return undefined;
    const out: Record<string, number> = {};
    for (const b of this.stats.bridges)
      for (const k of Object.keys(b) as (keyof BridgeCounters)[]) out[k] = (out[k] ?? 0) + b[k];
    return out;
  }

  /** The mixed step's per-candidate overlap and cost (kv-aware's former `explain`). */
  explain(req: RoutingRequest, candidates: readonly WorkerState[]): { overlaps: number[]; costs: number[] } {
    return this.steps.mixed.explain(req, candidates);
  }
}

/** The step policy of `policy` when it is a Scheduler, else null (a plain RoutingPolicy). */
export function stepOf(policy: RoutingPolicy, s: Step): StepPolicy | null {
  return policy instanceof Scheduler ? policy.step(s) : null;
}
