/**
 * Prompts this server routed that their worker has not prefilled yet, as prefix-tree paths per
 * worker: the bridge over the KV events' lag that lasts exactly as long as the lag.
 *
 * An engine reports a block (BlockStored) once it has computed it, so a prompt queued behind a
 * backlog is invisible to the KV index for as long as it waits. Under a burst of new prefixes
 * that is seconds, and every other request of the same prefix meanwhile sees no overlap anywhere
 * and is spread by load, each paying a cold prefill (bench/fleet-routing/RESULTS.md, "Run B").
 * A fixed window (`recentRoutingMs`) either ends before the queue drains or outlives the
 * prefill and overrides evictions the events have since reported. Here an entry lives while its
 * request is still pending prefill on that worker, plus `graceMs` for the events to arrive.
 *
 * Which entries are still pending is read from the worker's `pendingPrefillTokens` (prompt
 * tokens of this server's requests not yet past their first token, src/router/dispatch.ts) the
 * way the prefill-backlog scorer's ledger does: first tokens come roughly in routing order, so
 * the oldest entries leave while the entries' prompt tokens add up to more than what is pending.
 */

interface Entry {
  tokens: number;
  path: readonly number[];
  /** When the worker's pending count showed it past its first token (0: still pending). */
  doneAt: number;
}

interface WorkerPending {
  /** Routing order; entries [0, firstPending) are done and wait out the grace. */
  entries: Entry[];
  firstPending: number;
  /** Tokens of the entries still pending. */
  pendingTokens: number;
  /** Path node → number of live entries (done or pending) through it. */
  nodes: Map<number, number>;
}

export class PendingPrefixes {
  private readonly workers = new Map<string, WorkerPending>();
  private readonly graceMs: number;
  private readonly now: () => number;

  constructor(graceMs: number, now: () => number = Date.now) {
    this.graceMs = graceMs;
    this.now = now;
  }

  /** Records a prompt (its tree path, its prompt tokens) routed to `workerId`. */
  add(workerId: string, path: readonly number[], tokens: number): void {
    let w = this.workers.get(workerId);
    if (!w) {
      w = { entries: [], firstPending: 0, pendingTokens: 0, nodes: new Map() };
      this.workers.set(workerId, w);
    }
    w.entries.push({ tokens, path, doneAt: 0 });
    w.pendingTokens += tokens;
    for (const k of path) w.nodes.set(k, (w.nodes.get(k) ?? 0) + 1);
  }

  /**
   * Brings `workerId` up to date with its pending prefill (`pending` tokens) and returns how
   * many leading nodes of `path` its live entries cover.
   */
  match(workerId: string, path: readonly number[], pending: number): number {
    const w = this.workers.get(workerId);
    if (!w) return 0;
    this.settle(w, pending);
    let n = 0;
    while (n < path.length && w.nodes.has(path[n])) n++;
    return n;
  }

  /** Entries held for a worker (tests, metrics). */
  size(workerId: string): number {
    const w = this.workers.get(workerId);
    return w ? w.entries.length : 0;
  }

  removeWorker(workerId: string): void {
    this.workers.delete(workerId);
  }

  private settle(w: WorkerPending, pending: number): void {
    const now = this.now();
    // The oldest pending entries are past their first token while the rest still add up to
    // more than the worker's pending count.
    while (w.firstPending < w.entries.length && w.pendingTokens > pending) {
      const e = w.entries[w.firstPending++];
      w.pendingTokens -= e.tokens;
      e.doneAt = now;
    }
    // Done entries leave once their grace is over (they are in routing order, so done in order).
    let drop = 0;
    while (drop < w.firstPending && now - w.entries[drop].doneAt >= this.graceMs) {
      for (const k of w.entries[drop].path) {
        const c = w.nodes.get(k)! - 1;
        if (c === 0) w.nodes.delete(k);
        else w.nodes.set(k, c);
      }
      drop++;
    }
    if (drop > 0) {
      w.entries.splice(0, drop);
      w.firstPending -= drop;
    }
  }
}
