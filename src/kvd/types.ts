/** Retention classes a request may ask for (`kv_transfer_params.infera_retention`). */
export type Retention = "none" | "short" | "long";
/** Classes that are actually stored; `none` never is. `short` is evicted before `long`. */
export type StoredClass = "short" | "long";
export const EVICTION_ORDER: readonly StoredClass[] = ["short", "long"];
export const DEFAULT_RETENTION: Retention = "long";

export type TierName = "l2" | "l3" | "l4";

export interface PutOptions {
  retention?: Retention;
  /** Per-request TTL; the chunk expires from every tier after it. */
  ttlMs?: number;
}

export interface KvdConfig {
  socketPath?: string;
  /**
   * Optional TCP listener (copy path only: the arena fd cannot cross TCP). A host that is not
   * loopback needs `tcpToken` (the daemon refuses to start otherwise).
   */
  tcp?: { host: string; port: number };
  /** Shared secret every TCP client sends in HELLO (`token`); the Unix socket is guarded by its file mode. */
  tcpToken?: string;
  ramBytes: number;
  diskDir?: string;
  diskBytes: number;
  /** L4 store URL, e.g. redis://127.0.0.1:6379/0. */
  remoteUrl?: string;
  /** Make the Unix socket 0660 and chown it to this group (name or gid). */
  socketGroup?: string;
  metricsPort?: number;
  metricsHost?: string;
  /** Daemon-level ephemeral mode: RAM only, nothing is written to disk or the remote store. */
  ephemeral?: boolean;
  /** Largest data section a frame may carry (a header declaring more is answered 413 and closed). */
  maxFrameBytes?: number;
  /**
   * Per-connection backpressure bound: bytes of requests read and not yet answered plus
   * replies not yet sent; past it the connection is not read until under half. Default 64 MiB.
   */
  maxQueuedBytes?: number;
  /**
   * TCP connections open at once (default: half the open-files limit, at most 1024; the rest
   * is the reserve that keeps Unix-socket clients served). Over it a connection is closed at accept.
   */
  maxTcpConnections?: number;
  /** TCP connections open at once from one peer address (default 64). */
  maxTcpPerPeer?: number;
  /** A TCP connection whose HELLO is not accepted within this is closed (ms, default 5000). */
  authTimeoutMs?: number;
  /** Largest frame (meta + data) a TCP connection may send before its HELLO is accepted (default 4096). */
  preAuthFrameBytes?: number;
  /** How often expired chunks are swept (ms). */
  sweepMs?: number;
  /** Enable the AIS (hipFile GPU-direct) probe; default from INFERA_KVD_AIS. */
  ais?: boolean;
  /**
   * Read a large PUT's data from the socket straight into its arena reservation (default
   * true; INFERA_KVD_DIRECT_READ=0 turns it off). Falls back by itself where Node's
   * internals differ; STATS `socket_reads` says which path connections took.
   */
  directRead?: boolean;
}

export function chunkId(ns: string, key: string): string {
  return `${ns}\u0000${key}`;
}

export function isRetention(v: unknown): v is Retention {
  return v === "none" || v === "short" || v === "long";
}
