/**
 * Routing state shared by server replicas: the narrow interfaces the pipeline and the server
 * see. A replica announces each prompt its pending bridge records (the worker, the prompt's
 * approximate-tree path, its tokens) to its peers; each peer counts it as pending on that
 * worker for the announcement's TTL, exactly like its own bridge (../pipeline/pending-prefixes.ts).
 *
 * Types only, so the pipeline (ModelScope.peers) imports no transport.
 */

/** One model's view of the shared state (ModelScope.peers). */
export interface PeerRouting {
  /** Tells the peers that `path` (its prompt of `tokens` tokens) was routed to `workerId`. */
  announce(workerId: string, path: readonly number[], tokens: number): void;
  /**
   * Tells the peers that this replica's entry for `path` on `workerId` ended (its blocks are
   * confirmed by the events, or its request failed or was cancelled, or it expired): they stop
   * counting it then rather than at the announcement's TTL.
   */
  retract(workerId: string, path: readonly number[]): void;
  /** Leading nodes of `path` that live peer announcements cover on `workerId` (0: none). */
  match(workerId: string, path: readonly number[]): number;
}

/** One engine's load as a scraper read it, dated on this replica's clock (ms since the epoch). */
export interface ScrapedReading {
  worker: string;
  running: number;
  /** Waiting work, PD backlog included (as src/router/types.ts EngineLoad). */
  waiting: number;
  kvUsage: number;
  pdBacklog?: number;
  scrapedAt: number;
}

/**
 * One scrape of each engine shared among replicas (./load-share.ts): each worker is scraped by
 * one live replica (rendezvous hash of its id over the replicas heard from), which reports its
 * readings; the others file them instead of scraping.
 */
export interface SharedLoad {
  readonly replicaId: string;
  /** Whether this replica is the one that scrapes `workerId` (the live replicas' rendezvous hash). */
  isMine(workerId: string): boolean;
  /** Whether a live peer reported requests in flight on `workerId` (its owner scrapes it busy). */
  busyElsewhere(workerId: string): boolean;
  /**
   * How many replicas are live, itself included: flow control's `load` signal counts its own
   * dispatches since an engine reading once per replica (src/router/flow/load.ts).
   */
  liveCount(): number;
  /**
   * Sends this replica's new readings and the workers it has requests in flight on; also its
   * heartbeat (it counts as live for a few `periodMs` after), so it is sent every period.
   */
  report(readings: readonly ScrapedReading[], busy: readonly string[], periodMs: number): void;
  /** This replica stops scraping (its server closes): its peers take its workers over at once. */
  leave(): void;
  /** Peers' readings as they arrive (dated on this replica's clock). */
  onReadings: ((readings: readonly ScrapedReading[]) => void) | null;
}

/** What the server holds: one PeerRouting per model, and the plane's lifetime. */
export interface PeerPlane {
  /** The replica's id as its announcements carry it. */
  readonly replicaId: string;
  /** Where peers reach this replica (a ZMQ endpoint, a NATS subject). */
  readonly endpoint: string;
  /** The shared engine scrape, unless `peers.shareLoad` is false. */
  readonly load: SharedLoad | null;
  forModel(model: string): PeerRouting;
  close(): Promise<void>;
}

/**
 * Moves opaque frames among replicas (nats.js style: a narrow interface). Loss-tolerant by
 * contract: `publish` never throws and never waits; a frame that cannot go is dropped.
 */
export interface PeerTransport {
  readonly kind: "zmq" | "nats";
  /** Where peers reach this replica. */
  readonly endpoint: string;
  /**
   * One frame about `model` (NATS puts it on the model's subject; ZMQ sends it to all); `null`:
   * about no one model (load reports; NATS puts them on one subject every replica reads).
   */
  publish(model: string | null, frame: Uint8Array): void;
  /** Frames from peers (possibly this replica's own: the caller filters by sender id). */
  frames(): AsyncIterable<Uint8Array>;
  close(): Promise<void>;
}

/** Why an announcement was not taken (the `reason` label of the dropped counter). */
export type DropReason = "auth" | "malformed" | "stale" | "replay" | "full";
