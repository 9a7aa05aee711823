/**
 * The pending bridge: prompts routed to a worker that its KV events have not confirmed yet, as
 * prefix-tree paths per worker. An engine reports a block (BlockStored) once it has computed it,
 * so a prompt queued behind a backlog is invisible to the KV index for as long as it waits;
 * under a burst of new prefixes that is seconds, and every other request of the same prefix
 * meanwhile sees no overlap anywhere and is spread by load, each paying a cold prefill
 * (bench/fleet-routing/RESULTS.md, "Run B"). Here a routed prompt counts as cached on its worker
 *
 * - from the moment it is routed (`add`),
 * - until the engine's events confirm its blocks there: the entry's `probe` (the KV index's
 *   overlap for the prompt on that worker) reaches the prompt's full blocks. Probed only once the
 *   prefill is done (first byte), at most every `probeEveryMs`;
 * - or the request ends before its prefill is done: failed (connection, error status, broken
 *   stream) or cancelled by the client: nothing was cached, the entry leaves at once;
 * - or, once its prefill is done, when the index drops blocks of that worker (`evicted`: a
 *   BlockRemoved or AllBlocksCleared may have taken the prompt's blocks; the entry is probed once
 *   more and leaves either way), so an eviction is never overridden by the bridge;
 * - or `graceMs` after its prefill is done without a confirmation (the engine evicted the blocks
 *   before the index saw them, or publishes no events): the index is then the authority again;
 * - and at the latest `ttlMs` after routing, whatever happened (a handle nobody ended).
 *
 * A preempted request (the engine dropped its blocks and requeued it) is still pending on its
 * worker and keeps its entry: its prefill will run there again. After confirmation the entry is
 * gone, so a later BlockRemoved / AllBlocksCleared is never overridden by the bridge.
 *
 * An entry's lifecycle is driven through its handle (`BridgeEntry`), which the server's dispatch
 * claim calls (src/router/dispatch.ts `ClaimWatcher`): an explicit per-request signal, not an
 * inference from counts. Memory: at most `maxEntriesPerWorker` entries per worker (the oldest
 * leave first) and the entries' path nodes; a probe holds its prompt's token ids until the entry
 * leaves.
 *
 * Scope: entries are this replica's routing. Another replica's announced decision can be added
 * the same way: `add` with its own `ttlMs` (and a probe where the prompt's tokens are known),
 * then `prefilled()` or left to its TTL.
 */

/** How an entry's request ended before its prefill was done. */
export type DropReason = "failed" | "cancelled";

/** One routed prompt's hold on the bridge, ended by the request's dispatch claim. */
export interface BridgeEntry {
  /** The worker produced the first byte of a successful answer: the prefill is done. */
  prefilled(): void;
  /** The request ended before that: its blocks were not (all) computed. */
  dropped(reason: DropReason): void;
}

export interface PendingPrefixesOptions {
  /** How long a prefilled, unconfirmed entry lives (the events' lag). Default 1,000 ms. */
  graceMs?: number;
  /** Hard upper bound on an entry's life from routing. Default 300,000 ms. */
  ttlMs?: number;
  /** Entries kept per worker; the oldest leave first. Default 4,096. */
  maxEntriesPerWorker?: number;
  /**
   * Told when an entry leaves, for whatever reason (the peer plane retracts this replica's
   * announcement of it then: src/router/peers).
   */
  onEnd?: (workerId: string, path: readonly number[]) => void;
  /** Least time between two probes of one entry. Default 20 ms. */
  probeEveryMs?: number;
  now?: () => number;
}

/** Why entries left (tests, metrics). */
export interface BridgeCounters {
  added: number;
  confirmed: number;
  failed: number;
  cancelled: number;
  /** Prefilled, not confirmed within the grace. */
  unconfirmed: number;
  /** Prefilled, unconfirmed, and the index dropped blocks of the worker since. */
  evicted: number;
  expired: number;
  /** Dropped at the per-worker cap. */
  capped: number;
}

const PENDING = 0;
const PREFILLED = 1;
const GONE = 2;

class Entry implements BridgeEntry {
  state = PENDING;
  prefilledAt = 0;
  /** The worker's removal count when the prefill was done. */
  prefilledSeq = 0;
  nextProbe = 0;
  readonly owner: PendingPrefixes;
  readonly worker: string;
  readonly path: readonly number[];
  readonly expiresAt: number;
  /** What the index holds of this prompt on the worker now (null: no confirmation possible). */
  readonly probe: BridgeProbe | null;

  constructor(
    owner: PendingPrefixes,
    worker: string,
    path: readonly number[],
    expiresAt: number,
    probe: BridgeProbe | null,
  ) {
    this.owner = owner;
    this.worker = worker;
    this.path = path;
    this.expiresAt = expiresAt;
    this.probe = probe;
  }

  prefilled(): void {
    if (this.state !== PENDING) return;
    this.state = PREFILLED;
    this.prefilledAt = this.owner.clock();
    this.prefilledSeq = this.owner.removalsOf(this.worker);
    this.owner.touch(this.worker);
  }

  dropped(reason: DropReason): void {
    if (this.state !== PENDING) return;
    this.owner.remove(this, reason);
  }
}

interface WorkerEntries {
  /** Insertion order (a Set keeps it and deletes in O(1)). */
  entries: Set<Entry>;
  /** Path node → number of live entries through it. */
  nodes: Map<number, number>;
  /** Clock reading of the last settle (one per millisecond is enough). */
  settledAt: number;
  /** Times the index dropped blocks of this worker (while it had entries). */
  removals: number;
}

/** What the KV index holds of an entry's prompt on its worker: `held` ≥ `full` confirms it. */
export type BridgeProbe = () => { held: number; full: number };

export interface AddOptions {
  probe?: BridgeProbe | null;
  ttlMs?: number;
}

export class PendingPrefixes {
  private readonly workers = new Map<string, WorkerEntries>();
  private readonly graceMs: number;
  private readonly ttlMs: number;
  private readonly cap: number;
  private readonly probeEveryMs: number;
  private readonly onEnd: ((workerId: string, path: readonly number[]) => void) | undefined;
  readonly clock: () => number;
  readonly counters: BridgeCounters = {
    added: 0,
    confirmed: 0,
    failed: 0,
    cancelled: 0,
    unconfirmed: 0,
    evicted: 0,
    expired: 0,
    capped: 0,
  };

  constructor(o: PendingPrefixesOptions = {}) {
    this.graceMs = o.graceMs ?? 1000;
    this.ttlMs = o.ttlMs ?? 300_000;
    this.cap = Math.max(1, o.maxEntriesPerWorker ?? 4096);
    this.probeEveryMs = o.probeEveryMs ?? 20;
    this.onEnd = o.onEnd;
    this.clock = o.now ?? Date.now;
  }

  /**
   * Records a prompt (its tree path) routed to `workerId`. `probe` tells how many of the prompt's
   * full blocks the KV index holds on that worker (`held` ≥ `full` confirms the entry); without
   * one, the entry lives until its grace after prefill, a drop, or its TTL. `ttlMs` overrides
   * the bound for this entry (e.g. another replica's announcement, which no claim here ends).
   */
  add(workerId: string, path: readonly number[], o: AddOptions = {}): BridgeEntry {
    let w = this.workers.get(workerId);
    if (!w) {
      w = { entries: new Set(), nodes: new Map(), settledAt: -1, removals: 0 };
      this.workers.set(workerId, w);
    }
    const now = this.clock();
    const e = new Entry(this, workerId, path, now + (o.ttlMs ?? this.ttlMs), o.probe ?? null);
    if (w.entries.size >= this.cap) {
      const oldest = w.entries.values().next().value as Entry;
      this.remove(oldest, "capped");
    }
    w.entries.add(e);
    for (const k of path) w.nodes.set(k, (w.nodes.get(k) ?? 0) + 1);
    this.counters.added++;
    return e;
  }

  /** Brings `workerId` up to date and returns how many leading nodes of `path` its live entries cover. */
  match(workerId: string, path: readonly number[]): number {
    const w = this.workers.get(workerId);
    if (!w) return 0;
    this.settle(w);
    let n = 0;
    while (n < path.length && w.nodes.has(path[n])) n++;
    return n;
  }

  /**
   * `match` for every worker that has live entries (brought up to date first, with one clock
   * read): `fn` gets each whose entries cover at least the first node of `path`, and how many.
   * A decision over a large fleet visits the few workers with entries instead of asking for
   * every candidate.
   */
  forEachMatch(path: readonly number[], fn: (workerId: string, nodes: number) => void): void {
    if (path.length === 0 || this.workers.size === 0) return;
    const now = this.clock();
    // Settling may delete the entry being visited: a Map iteration allows that.
    for (const [id, w] of this.workers) {
      this.settle(w, now);
      if (!w.nodes.has(path[0])) continue;
      let n = 1;
      while (n < path.length && w.nodes.has(path[n])) n++;
      fn(id, n);
    }
  }

  /** Live entries of a worker (tests, metrics). */
  size(workerId: string): number {
    const w = this.workers.get(workerId);
    if (!w) return 0;
    this.settle(w);
    return w.entries.size;
  }

  /** The index dropped blocks of `workerId`: its prefilled entries are probed once more and leave. */
  evicted(workerId: string): void {
    const w = this.workers.get(workerId);
    if (!w) return;
    w.removals++;
    w.settledAt = -1;
  }

  /** An entry of `workerId` changed state: the next match settles again. */
  touch(workerId: string): void {
    const w = this.workers.get(workerId);
    if (w) w.settledAt = -1;
  }

  /** The removal count of a worker (entries note it when prefilled). */
  removalsOf(workerId: string): number {
    return this.workers.get(workerId)?.removals ?? 0;
  }

  removeWorker(workerId: string): void {
    const w = this.workers.get(workerId);
    if (!w) return;
    for (const e of w.entries) e.state = GONE;
    this.workers.delete(workerId);
  }

  /** Takes `e` out (idempotent), counting why. */
  remove(e: Entry, why: keyof BridgeCounters): void {
    if (e.state === GONE) return;
    e.state = GONE;
    this.counters[why]++;
    const w = this.workers.get(e.worker);
    if (!w?.entries.delete(e)) return;
    for (const k of e.path) {
      const c = w.nodes.get(k)! - 1;
      if (c === 0) w.nodes.delete(k);
      else w.nodes.set(k, c);
    }
    if (w.entries.size === 0) this.workers.delete(e.worker);
    this.onEnd?.(e.worker, e.path);
  }

  /** Ends entries that are confirmed, past their grace or past their TTL. */
  private settle(w: WorkerEntries, now = this.clock()): void {
    if (now === w.settledAt) return;
    w.settledAt = now;
    for (const e of w.entries) {
      if (now >= e.expiresAt) {
        this.remove(e, "expired");
        continue;
      }
      if (e.state !== PREFILLED) continue;
      const dropped = e.prefilledSeq !== w.removals;
      if (e.probe && (dropped || now >= e.nextProbe)) {
        e.nextProbe = now + this.probeEveryMs;
        const { held, full } = e.probe();
        if (held >= full) {
          this.remove(e, "confirmed");
          continue;
        }
      }
      if (dropped) this.remove(e, "evicted");
      else if (now - e.prefilledAt >= this.graceMs) this.remove(e, "unconfirmed");
    }
  }
}
