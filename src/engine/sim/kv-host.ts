import { InferaError } from "../../protocol/errors.ts";
import { extendBlockHashes } from "./block-hash.ts";
import type { SimEngine } from "./engine.ts";
import type { HeldKv, SimKvHost } from "./pd/types.ts";
import type { Sequence } from "./sequence.ts";

interface HeldEntry extends HeldKv {
  timer: NodeJS.Timeout;
}

/**
 * The core's side of the PD seam (pd/types.ts): holds a finished prefill's blocks for the
 * decode worker's pull, and inserts pulled KV on the decode worker as computed blocks.
 */
export class SimKvHostImpl implements SimKvHost {
  private readonly engine: SimEngine;
  readonly engineId: string;
  readonly blockSize: number;
  readonly kvBytesPerBlock: number;
  readonly host: string;
  httpPort = 0;
  readonly tpSize: number;
  readonly dpSize: number;
  readonly dpRank: number;
  private readonly held = new Map<string, HeldEntry>();
  /** Blocks of finished prefills not yet claimed by holdBlocks(). */
  private readonly finished = new Map<string, HeldEntry>();
  /** Decode side: cache_salt per request id, set before the pull so imported blocks hash right. */
  private readonly salts = new Map<string, string>();

  constructor(engine: SimEngine, opts: { engineId: string; host: string; holdTimeoutMs: number }) {
    this.engine = engine;
    const cfg = engine.cfg;
    this.engineId = opts.engineId;
    this.blockSize = cfg.blockSize;
    this.kvBytesPerBlock = cfg.profile.kv_bytes_per_token * cfg.blockSize;
    this.host = opts.host;
    this.tpSize = cfg.tpSize;
    this.dpSize = cfg.dpSize;
    this.dpRank = cfg.dpRank;
    this.holdTimeoutMs = opts.holdTimeoutMs;
    engine.scheduler.holdHook = (seq) => this.onPrefillDone(seq);
  }

  private readonly holdTimeoutMs: number;

  get numHeld(): number {
    return this.held.size + this.finished.size;
  }

  /** Scheduler hook: a holdOnFinish sequence finished; park its blocks until holdBlocks(). */
  private onPrefillDone(seq: Sequence): void {
    const id = seq.requestId;
    this.releaseHeld(id);
    const entry: HeldEntry = {
      requestId: id,
      blockIds: seq.blockIds.slice(),
      tokenIds: seq.promptIds,
      firstTokenId: seq.tokens[seq.numPromptTokens],
      // Safety net: the connector normally releases on pull or on its own expiry.
      timer: setTimeout(() => this.releaseHeld(id), this.holdTimeoutMs + 5000),
    };
    entry.timer.unref();
    this.finished.set(id, entry);
  }

  holdBlocks(requestId: string): HeldKv | null {
    const e = this.finished.get(requestId) ?? this.held.get(requestId);
    if (!e) return null;
    this.finished.delete(requestId);
    this.held.set(requestId, e);
    return { requestId, blockIds: e.blockIds, tokenIds: e.tokenIds, firstTokenId: e.firstTokenId };
  }

  getHeld(requestId: string): HeldKv | null {
    const e = this.held.get(requestId);
    return e ? { requestId, blockIds: e.blockIds, tokenIds: e.tokenIds, firstTokenId: e.firstTokenId } : null;
  }

  releaseHeld(requestId: string): void {
    for (const map of [this.held, this.finished]) {
      const e = map.get(requestId);
      if (!e) continue;
      map.delete(requestId);
      clearTimeout(e.timer);
      this.engine.pool.free(e.blockIds);
      this.engine.kick();
    }
  }

  setSalt(requestId: string, salt: string | null): void {
    if (salt === null) this.salts.delete(requestId);
    else this.salts.set(requestId, salt);
  }

  importBlocks(requestId: string, tokenIds: readonly number[]): { importedTokens: number } {
    const pool = this.engine.pool;
    const sched = this.engine.scheduler;
    const bs = this.blockSize;
    const salt = this.salts.get(requestId) ?? null;
    this.salts.delete(requestId);
    sched.dropImport(requestId);
    const tokens = tokenIds.slice();
    const hashes = extendBlockHashes([], tokens, bs, salt);
    const blockIds: number[] = [];
    let hitBlocks = 0;
    while (hitBlocks < hashes.length) {
      const id = pool.lookup(hashes[hitBlocks]);
      if (id === undefined) break;
      pool.touch(id);
      blockIds.push(id);
      hitBlocks++;
    }
    const need = Math.ceil(tokens.length / bs) - blockIds.length;
    const fresh = need > 0 ? pool.allocate(need) : [];
    if (!fresh) {
      pool.free(blockIds);
      throw new InferaError(
        503,
        "Not enough free KV blocks to receive the transferred prefix; retry shortly.",
        {
          type: "service_unavailable",
          code: "kv_capacity",
        },
      );
    }
    for (const id of fresh) blockIds.push(id);
    pool.cacheBlocks(blockIds, hashes, tokens, hitBlocks, hashes.length, salt);
    this.engine.flushEvents();
    sched.imports.set(requestId, { blockIds, tokenIds: tokens, localHitTokens: hitBlocks * bs });
    return { importedTokens: tokens.length };
  }

  close(): void {
    for (const id of [...this.held.keys(), ...this.finished.keys()]) this.releaseHeld(id);
  }
}
