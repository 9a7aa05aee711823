import { extendBlockHashes } from "./block-hash.ts";
import type { BlockPool } from "./block-pool.ts";
import type { FinishReason } from "./output.ts";
import type { StepShape } from "./profile.ts";
import type { Sequence } from "./sequence.ts";

/**
 * Continuous batching after vLLM V1's scheduler. Each step: running sequences first (one
 * decode token each, or the next chunk of an unfinished prefill), preempting the most
 * recently admitted sequence (recompute) when blocks run out; then, if nothing was
 * preempted, waiting sequences in FCFS order while the sequence limit, the token budget
 * (chunked prefill) and free blocks allow. The step's tokens take effect in complete().
 */
export interface ScheduledChunk {
  seq: Sequence;
  numNew: number;
}

export interface StepPlan {
  chunks: ScheduledChunk[];
  shape: StepShape;
}

/** KV a decode worker received from its prefill peer, waiting for its request to be admitted. */
export interface ImportedKv {
  blockIds: number[];
  tokenIds: number[];
  /** Leading tokens that were already in the local prefix cache. */
  localHitTokens: number;
}

export interface SchedulerObserver {
  /** First admission: `cachedTokens` were found computed (`externalTokens` of them from a transfer). */
  onFirstScheduled(seq: Sequence, nowMs: number): void;
  onToken(seq: Sequence, nowMs: number): void;
  onFinished(seq: Sequence, reason: FinishReason): void;
  onPreempted(seq: Sequence): void;
}

export interface SchedulerLimits {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
}

export class Scheduler {
  readonly pool: BlockPool;
  readonly limits: SchedulerLimits;
  private readonly observer: SchedulerObserver;
  private readonly now: () => number;
  readonly waiting: Sequence[] = [];
  readonly running: Sequence[] = [];
  readonly imports = new Map<string, ImportedKv>();
  /** Called instead of freeing when a holdOnFinish sequence finishes; takes over its blocks. */
  holdHook: ((seq: Sequence) => void) | null = null;

  constructor(
    pool: BlockPool,
    limits: SchedulerLimits,
    observer: SchedulerObserver,
    now: () => number = () => performance.now(),
  ) {
    this.pool = pool;
    this.limits = limits;
    this.observer = observer;
    this.now = now;
  }

  get hasWork(): boolean {
    return this.running.length > 0 || this.waiting.length > 0;
  }

  /**
   * Queues `seq` behind every waiting sequence of the same or a lower priority value: FCFS when
   * all are 0, lower value first otherwise (vLLM's priority policy orders its waiting queue by
   * (priority, arrival time): vllm/v1/core/sched/request_queue.py PriorityRequestQueue).
   */
  add(seq: Sequence): void {
    seq.status = "waiting";
    const w = this.waiting;
    let at = w.length;
    while (at > 0 && w[at - 1].priority > seq.priority) at--;
    if (at === w.length) w.push(seq);
    else w.splice(at, 0, seq);
  }

  schedule(): StepPlan | null {
    const bs = this.pool.blockSize;
    let budget = this.limits.maxNumBatchedTokens;
    const chunks: ScheduledChunk[] = [];
    let preempted = false;

    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const seq = this.running[i];
      const numNew = Math.min(seq.tokens.length - seq.numComputed, budget);
      if (numNew <= 0) continue;
      let ok = this.ensureBlocks(seq, numNew);
      while (!ok) {
        const victim = this.running[this.running.length - 1];
        this.preempt(victim);
        preempted = true;
        if (victim === seq) break;
        ok = this.ensureBlocks(seq, numNew);
      }
      if (!ok) break;
      chunks.push({ seq, numNew });
      budget -= numNew;
    }

    if (!preempted || chunks.length === 0) {
      while (this.waiting.length > 0 && budget > 0 && this.running.length < this.limits.maxNumSeqs) {
        const seq = this.waiting[0];
        if (Math.ceil(seq.tokens.length / bs) > this.pool.numBlocks) {
          // Grew past the whole pool: it can never run again.
          this.finish(seq, "length");
          continue;
        }
        const numNew = this.admit(seq, budget);
        if (numNew === 0) break;
        this.waiting.shift();
        seq.status = "running";
        this.running.push(seq);
        chunks.push({ seq, numNew });
        budget -= numNew;
      }
    }
    if (chunks.length === 0) return null;

    const shape: StepShape = { prefillTokens: 0, prefillTokenCtx: 0, decodeSeqs: 0, decodeKvTokens: 0 };
    for (const { seq, numNew } of chunks) {
      const end = seq.numComputed + numNew;
      if (numNew === 1 && seq.numOutputTokens > 0 && end === seq.tokens.length) {
        shape.decodeSeqs++;
        shape.decodeKvTokens += end;
      } else {
        shape.prefillTokens += numNew;
        shape.prefillTokenCtx += numNew * end;
      }
    }
    return { chunks, shape };
  }

  /** Applies a step: tokens become computed, full blocks are cached, finished prefills sample a token. */
  complete(plan: StepPlan): void {
    const bs = this.pool.blockSize;
    const now = this.now();
    for (const { seq, numNew } of plan.chunks) {
      if (seq.status !== "running") continue;
      seq.numComputed += numNew;
      const full = Math.floor(seq.numComputed / bs);
      if (full > seq.numCachedBlocks) {
        extendBlockHashes(seq.blockHashes, seq.tokens, bs, seq.salt);
        this.pool.cacheBlocks(seq.blockIds, seq.blockHashes, seq.tokens, seq.numCachedBlocks, full, seq.salt);
        seq.numCachedBlocks = full;
      }
      if (seq.numComputed < seq.tokens.length) continue;
      seq.tokens.push(seq.output.nextToken());
      const stopHit = seq.output.appendLast();
      if (seq.firstTokenMs === 0) seq.firstTokenMs = now;
      this.observer.onToken(seq, now);
      seq.lastTokenMs = now;
      seq.sink.onToken(seq);
      if (stopHit) this.finish(seq, "stop");
      else if (seq.numOutputTokens >= seq.maxTokens) this.finish(seq, seq.limitReason);
      else if (seq.tokens.length >= this.limits.maxModelLen) this.finish(seq, "length");
    }
  }

  /** Ends a sequence: releases (or hands over for holding) its blocks and tells its sink. */
  finish(seq: Sequence, reason: FinishReason): void {
    if (seq.status === "finished") return;
    const list = seq.status === "running" ? this.running : this.waiting;
    const at = list.indexOf(seq);
    if (at >= 0) list.splice(at, 1);
    seq.status = "finished";
    seq.finishReason = reason;
    if (seq.holdOnFinish && reason !== "abort" && this.holdHook) this.holdHook(seq);
    else this.pool.free(seq.blockIds);
    seq.blockIds = [];
    if (seq.index === 0) this.dropImport(seq.requestId);
    this.observer.onFinished(seq, reason);
    seq.sink.onFinish(seq, reason);
  }

  abort(seq: Sequence): void {
    this.finish(seq, "abort");
  }

  dropImport(requestId: string): void {
    const imp = this.imports.get(requestId);
    if (!imp) return;
    this.imports.delete(requestId);
    this.pool.free(imp.blockIds);
  }

  private ensureBlocks(seq: Sequence, numNew: number): boolean {
    const need = Math.ceil((seq.numComputed + numNew) / this.pool.blockSize) - seq.blockIds.length;
    if (need <= 0) return true;
    const ids = this.pool.allocate(need);
    if (!ids) return false;
    for (const id of ids) seq.blockIds.push(id);
    return true;
  }

  private preempt(seq: Sequence): void {
    const at = this.running.lastIndexOf(seq);
    if (at >= 0) this.running.splice(at, 1);
    this.pool.free(seq.blockIds);
    seq.blockIds = [];
    seq.numComputed = 0;
    seq.numCachedBlocks = 0;
    seq.numPreemptions++;
    seq.status = "waiting";
    this.waiting.unshift(seq);
    this.observer.onPreempted(seq);
  }

  /**
   * Tries to admit `seq`: takes imported KV or prefix-cache hits, then blocks for the first
   * chunk. Returns the chunk's token count, or 0 (nothing taken) when blocks are short.
   */
  private admit(seq: Sequence, budget: number): number {
    const bs = this.pool.blockSize;
    const first = seq.firstScheduledMs === 0;
    if (seq.blockIds.length === 0 && seq.numComputed === 0) {
      const imp = seq.index === 0 ? this.imports.get(seq.requestId) : undefined;
      if (imp) this.takeImport(seq, imp);
    }
    const hits: number[] = [];
    if (seq.blockIds.length === 0) {
      extendBlockHashes(seq.blockHashes, seq.tokens, bs, seq.salt);
      // At least one token is always computed, to produce the next token's logits.
      const maxHit = Math.floor((seq.tokens.length - 1) / bs);
      for (let b = 0; b < maxHit; b++) {
        const id = this.pool.lookup(seq.blockHashes[b]);
        if (id === undefined) break;
        hits.push(id);
      }
    }
    const computed = seq.blockIds.length > 0 ? seq.numComputed : hits.length * bs;
    const numNew = Math.min(seq.tokens.length - computed, budget);
    const need = Math.ceil((computed + numNew) / bs) - seq.blockIds.length - hits.length;
    let freeAfterTouch = this.pool.numFree;
    for (const id of hits) if (this.pool.isFree(id)) freeAfterTouch--;
    if (need > freeAfterTouch) return 0;
    for (const id of hits) {
      this.pool.touch(id);
      seq.blockIds.push(id);
    }
    if (hits.length > 0) {
      seq.numComputed = computed;
      seq.numCachedBlocks = hits.length;
    }
    if (need > 0) {
      const ids = this.pool.allocate(need)!;
      for (const id of ids) seq.blockIds.push(id);
    }
    if (first) {
      seq.firstScheduledMs = this.now();
      seq.numCachedPromptTokens = Math.min(seq.numComputed, seq.numPromptTokens);
      this.observer.onFirstScheduled(seq, seq.firstScheduledMs);
    }
    return numNew;
  }

  private takeImport(seq: Sequence, imp: ImportedKv): void {
    this.imports.delete(seq.requestId);
    const bs = this.pool.blockSize;
    let match = 0;
    const lim = Math.min(imp.tokenIds.length, seq.tokens.length);
    while (match < lim && imp.tokenIds[match] === seq.tokens[match]) match++;
    const keep = Math.ceil(match / bs);
    if (keep < imp.blockIds.length) this.pool.free(imp.blockIds.slice(keep));
    seq.blockIds = imp.blockIds.slice(0, keep);
    seq.numComputed = Math.min(match, seq.tokens.length - 1);
    seq.numCachedBlocks = 0;
    const local = Math.min(imp.localHitTokens, seq.numComputed);
    seq.numExternalTokens = seq.numComputed - local;
  }
}
