/**
 * Builds a fleet of W workers × B blocks into an index (the new one or the frozen baseline),
 * then times prompt matches against it. Shared by both sides of bench/kv-index/run.ts, so the
 * two indexes see the same events.
 *
 * Every worker holds:
 * - a 64-block system prompt (the same tokens on all workers: one model, one chat template);
 * - workers 0-7 additionally the 8k-token probe document (a hot document routed to 8 replicas);
 * - a fraction `shared` of its blocks from a pool of 64-block chains each held by `replicas`
 *   workers (popular documents, few-shot sets, tool schemas that load balancing spreads);
 * - the rest: chains of its own (conversations), held by no one else.
 * Engine hashes are unique per worker and block, as with vLLM's per-process random hash seed.
 */
import type { KvEvent } from "../../src/kv/events.ts";
import { blockStored } from "../../test/helpers/kv-events.ts";

export const BS = 16;
const CHAIN = 64;

export interface FleetIndex {
  addWorker(id: string, blockSize: number, expectedBlocks?: number, kvBlocks?: number): void;
  apply(workerId: string, ev: KvEvent, defaultBlockSize?: number, rank?: number): void;
  overlaps(tokens: ArrayLike<number>, workerIds: readonly string[]): Int32Array;
  totalBlocks(): number;
  bytes(): number;
}

export interface FleetShape {
  workers: number;
  blocks: number;
  /** Fraction of each worker's blocks from the replicated pool (0 = no sharing). */
  shared: number;
  /** Workers holding each pool chain. */
  replicas: number;
}

export function tokensFor(seed: number, n: number): number[] {
  const out = new Array<number>(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = (x >>> 0) % 200_000;
  }
  return out;
}

export const SYSTEM = tokensFor(777, CHAIN * BS);
export const PROBE = tokensFor(424242, 8192);
/** The system prompt then tokens nobody holds: every worker matches 64 blocks, then the walk ends. */
export const SYSTEM_PROBE = [...SYSTEM, ...tokensFor(31337, 8192 - SYSTEM.length)];

export function buildFleet(idx: FleetIndex, shape: FleetShape): void {
  const { workers, blocks } = shape;
  const promptBlocks = PROBE.length / BS;
  let engineHash = 1;
  const hashes = (n: number) => Array.from({ length: n }, () => engineHash++);
  // Pool chains: workers in groups of `replicas` hold the same chains, so each chain is held by
  // exactly `replicas` workers.
  const perWorkerPool = Math.floor((blocks * shape.shared) / CHAIN);
  const replicas = Math.max(1, shape.replicas);
  const own = tokensFor(1, CHAIN * BS);
  const pool = tokensFor(2, CHAIN * BS);
  for (let w = 0; w < workers; w++) {
    const id = `worker-${w}`;
    idx.addWorker(id, BS, blocks);
    idx.apply(id, blockStored(hashes(CHAIN), SYSTEM, BS));
    let stored = CHAIN;
    if (w < 8) {
      idx.apply(id, blockStored(hashes(promptBlocks), PROBE, BS));
      stored += promptBlocks;
    }
    const group = Math.floor(w / replicas);
    for (let j = 0; j < perWorkerPool && stored + CHAIN <= blocks; j++) {
      const c = group * perWorkerPool + j;
      pool[0] = c; // a different first token per pool chain, so each is its own prefix
      pool[1] = 0x5ee;
      idx.apply(id, blockStored(hashes(CHAIN), pool, BS));
      stored += CHAIN;
    }
    while (stored < blocks) {
      const n = Math.min(CHAIN, blocks - stored);
      own[0] = stored; // a different root per chain
      own[1] = w;
      idx.apply(id, blockStored(hashes(n), own, BS));
      stored += n;
    }
  }
}

export interface Timing {
  /** Wall clock per call (includes whatever else the shared machine schedules meanwhile). */
  p50: number;
  p99: number;
  /** Process CPU time per call, p50 over batches of 10 calls (µs; less scheduler noise). */
  cpu50: number;
}

export function timeMatch(idx: FleetIndex, prompt: number[], ids: string[], iters: number): Timing {
  for (let i = 0; i < Math.min(50, iters); i++) idx.overlaps(prompt, ids);
  const samples: number[] = [];
  for (let i = 0; i < iters; i++) {
    const t = process.hrtime.bigint();
    idx.overlaps(prompt, ids);
    samples.push(Number(process.hrtime.bigint() - t) / 1000);
  }
  samples.sort((a, b) => a - b);
  const cpu: number[] = [];
  for (let i = 0; i < iters / 10; i++) {
    const t0 = process.cpuUsage();
    for (let j = 0; j < 10; j++) idx.overlaps(prompt, ids);
    const cu = process.cpuUsage(t0);
    cpu.push((cu.user + cu.system) / 10);
  }
  cpu.sort((a, b) => a - b);
  return {
    p50: samples[Math.floor(iters / 2)],
    p99: samples[Math.floor(iters * 0.99)],
    cpu50: cpu[Math.floor(cpu.length / 2)],
  };
}
