import type { FastHistogramFamily } from "../../util/fast-metrics.ts";
import type { Logger } from "../../util/log.ts";
import { BlockPool } from "./block-pool.ts";
import { offloadBlockFactor, offloadCpuBlocks, type SimConfig } from "./config.ts";
import type { KvEventPublisher } from "./kv-publisher.ts";
import { SimMetrics } from "./metrics.ts";
import type { Personality } from "./personalities/types.ts";
import { stepSeconds } from "./profile.ts";
import { type ScheduledChunk, Scheduler, type StepPlan } from "./scheduler.ts";
import type { Sequence } from "./sequence.ts";

/** A step ending this much after its simulated end counts as late (timers alone jitter ~1 ms). */
const LATE_MS = 10;

/**
 * The engine loop: one timer per scheduler step. A step is planned, its simulated duration
 * (timing model / --speed) elapses, then its tokens take effect and the next step is
 * planned at once. When the process falls behind simulated time it runs steps back to back
 * (up to a few ms of CPU) before yielding to I/O, so a high --speed stays cheap.
 */
export class SimEngine {
  readonly cfg: SimConfig;
  private readonly log: Logger;
  readonly rank: number;
  readonly pool: BlockPool;
  readonly scheduler: Scheduler;
  readonly metrics: SimMetrics;
  publisher: KvEventPublisher | null = null;
  /** Simulated seconds elapsed in steps. */
  simSeconds = 0;
  steps = 0;
  /**
   * Steps that ended more than LATE_MS after their simulated end (the event loop was busy: the
   * CPU, not the model, set the pace), and their total lateness. A fleet reports them.
   */
  lateSteps = 0;
  lateMs = 0;
  /** Decode-side requests waiting for their KV pull (vLLM counts them as waiting). */
  pendingPulls = 0;
  private plan: StepPlan | null = null;
  /** The plan whose tokens are being applied (for recovery if that throws). */
  private completing: StepPlan | null = null;
  private timer: NodeJS.Timeout | null = null;
  private stepEndMs = 0;
  private closed = false;

  /** PD backlog on a prefill worker: finished prefills whose KV waits for the decode side. */
  heldForTransfer: () => number = () => 0;

  /**
   * @param rank the data-parallel rank this scheduler + pool is (one SimEngine per rank).
   * @param itlFamily shared by the ranks of one process, so /metrics renders the family once.
   */
  constructor(
    cfg: SimConfig,
    personality: Personality,
    log: Logger,
    rank: number = cfg.dpRank,
    itlFamily?: FastHistogramFamily,
  ) {
    this.cfg = cfg;
    this.log = log;
    this.rank = rank;
    this.pool = new BlockPool(
      cfg.numGpuBlocks,
      cfg.blockSize,
      cfg.enablePrefixCaching,
      offloadCpuBlocks(cfg.kvTransferConfig),
      offloadCpuBlocks(cfg.kvTransferConfig) > 0
        ? offloadBlockFactor(cfg.kvTransferConfig, cfg.blockSize)
        : 1,
    );
    this.metrics = new SimMetrics({
      personality,
      modelName: cfg.servedModelNames[0],
      dpRank: rank,
      dpSize: cfg.dpSize,
      role: cfg.role,
      gauges: {
        running: () => this.scheduler.running.length,
        waiting: () => this.scheduler.waiting.length + this.pendingPulls,
        kvUsage: () => this.pool.usage(),
        blocksUsed: () => this.pool.numUsed,
        blocksTotal: () => cfg.numGpuBlocks,
        prefillInflight: () => this.heldForTransfer(),
        decodePrealloc: () => this.pendingPulls,
      },
      cache: {
        blockSize: cfg.blockSize,
        numGpuBlocks: cfg.numGpuBlocks,
        prefixCaching: cfg.enablePrefixCaching,
      },
      itlFamily,
    });
    this.scheduler = new Scheduler(
      this.pool,
      {
        maxNumSeqs: cfg.maxNumSeqs,
        maxNumBatchedTokens: cfg.maxNumBatchedTokens,
        maxModelLen: cfg.maxModelLen,
      },
      this.metrics,
    );
  }

  submit(seq: Sequence): void {
    if (this.closed) return;
    this.scheduler.add(seq);
    this.kick();
  }

  abort(seq: Sequence): void {
    if (seq.isFinished) return;
    this.scheduler.abort(seq);
    this.flushEvents();
    this.kick();
  }

  /** Publishes what the pool did since the last flush (one batch). */
  flushEvents(): void {
    if (this.pool.pending.length === 0) return;
    const events = this.pool.drain();
    this.publisher?.publish(events);
  }

  /** vLLM's reset_prefix_cache: refused (false) while blocks are in use. */
  resetPrefixCache(): boolean {
    const ok = this.pool.reset();
    this.flushEvents();
    return ok;
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    for (const seq of [...this.scheduler.running, ...this.scheduler.waiting]) this.scheduler.abort(seq);
  }

  /** Starts stepping if idle (new work, or blocks were freed). */
  kick(): void {
    if (this.timer || this.plan) return;
    this.stepEndMs = performance.now();
    this.timer = setTimeout(this.onTimer, 0);
  }

  private readonly onTimer = (): void => {
    try {
      this.runSteps();
    } catch (err) {
      // A bug in a step must not take the worker down: fail the sequences involved, carry on.
      this.log.error({ err }, "scheduler step failed");
      const plan = this.completing ?? this.plan;
      this.plan = null;
      this.completing = null;
      for (const c of plan?.chunks ?? []) this.scheduler.abort(c.seq);
      if (!this.timer && this.scheduler.hasWork) this.timer = setTimeout(this.onTimer, 10);
    }
  };

  private runSteps(): void {
    this.timer = null;
    const t0 = performance.now();
    if (this.plan && t0 - this.stepEndMs > LATE_MS) {
      this.lateSteps++;
      this.lateMs += t0 - this.stepEndMs;
    }
    for (;;) {
      if (this.plan) {
        const plan = this.plan;
        this.plan = null;
        this.completing = plan;
        this.scheduler.complete(plan);
        this.completing = null;
      }
      if (this.closed) return;
      this.plan = this.scheduler.schedule();
      this.flushEvents();
      if (!this.plan) {
        // Work that cannot be admitted yet (blocks held for PD pulls): look again shortly.
        if (this.scheduler.hasWork) this.timer = setTimeout(this.onTimer, 10);
        return;
      }
      const sec = stepSeconds(this.cfg.profile, this.plan.shape);
      this.simSeconds += sec;
      this.steps++;
      const now = performance.now();
      // Never let a backlog of simulated time build up beyond 50 ms of real time.
      this.stepEndMs = Math.max(this.stepEndMs, now - 50) + (sec * 1000) / this.cfg.speed;
      if (this.stepEndMs > now + 0.25) {
        this.timer = setTimeout(this.onTimer, this.stepEndMs - now);
        return;
      }
      if (now - t0 > 4) {
        this.timer = setTimeout(this.onTimer, 0);
        return;
      }
    }
  }

  /** Running or waiting sequences of one request id (for PD bookkeeping). */
  findRequest(requestId: string): Sequence[] {
    const out: Sequence[] = [];
    const match = (s: Sequence): void => {
      if (s.requestId === requestId) out.push(s);
    };
    this.scheduler.running.forEach(match);
    this.scheduler.waiting.forEach(match);
    return out;
  }

  get logger(): Logger {
    return this.log;
  }
}

export type { ScheduledChunk };
