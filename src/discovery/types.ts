/**
 * The worker record every discovery backend stores and every server reads
 * (DESIGN.md, "Planes"). In etcd it is JSON under `/infera/workers/<model>/<worker-id>`.
 */
export type EngineKind = "vllm" | "sglang" | "atom" | "sim";
export type WorkerRole = "mixed" | "prefill" | "decode";
export type ConnectorKind = "nixl" | "mooncake" | "moriio" | "sglang" | "atom" | "none";

export interface ConnectorInfo {
  kind: ConnectorKind;
  /** Host other workers use to reach this worker's KV side channel / bootstrap server. */
  bootstrapHost?: string;
  /** Mooncake / SGLang bootstrap port, Nixl side-channel port. */
  bootstrapPort?: number;
  /** MoRIIO / ATOM handshake port. */
  handshakePort?: number;
  /** MoRIIO notify port. */
  notifyPort?: number;
  /**
   * MoRIIO transfer mode (the `transfer_mode` a worker registers with the proxy): READ = D
   * pulls after P answered (serial), WRITE = P pushes while D waits (concurrent; vLLM's
   * default). Absent: READ, the mode Infera's launchers configure.
   */
  transferMode?: "READ" | "WRITE";
}

/** One data-parallel rank's KV-event sockets. */
export interface KvEventsRank {
  dpRank: number;
  /** Where a subscriber connects for this rank's PUB socket (never `*`). */
  endpoint: string;
  /** This rank's replay ROUTER socket (vLLM/SGLang). */
  replayEndpoint?: string;
}

export interface KvEventsInfo {
  /** Where a subscriber connects, e.g. `tcp://10.0.0.5:5557` (never `*`); rank 0's when `ranks` is set. */
  endpoint: string;
  /** vLLM/SGLang replay ROUTER socket; absent for ATOM. */
  replayEndpoint?: string;
  /** ZMQ topic ("" = all). */
  topic: string;
  /** Frame layout: vLLM/SGLang send [topic, seq, payload]; ATOM [payload] or [topic, payload]. */
  framing: "seq" | "atom";
  /**
   * Every rank's sockets when the engine publishes per data-parallel rank (vLLM and SGLang
   * bind rank r's PUB on port + r and its replay on replay port + r); a subscriber follows
   * each rank, with its own sequence numbers. Absent: the single endpoint above.
   */
  ranks?: KvEventsRank[];
}

export interface WorkerRecord {
  /** Unique per worker process, stable for its lifetime. */
  id: string;
  /** The model path or name the engine loaded. */
  model: string;
  /** Names clients may put in `model` (vLLM `--served-model-name`); includes `model` when none given. */
  servedModelNames: string[];
  engine: EngineKind;
  role: WorkerRole;
  /** Base HTTP URL of the engine's OpenAI server, e.g. `http://127.0.0.1:8001`. */
  url: string;
  connector: ConnectorInfo;
  blockSize: number;
  kvEvents?: KvEventsInfo;
  dpSize: number;
  tpSize: number;
  dpRank?: number;
  maxModelLen: number;
  /** KV blocks the engine's pool holds, when known; the router caps its index for this worker from it. */
  kvBlocks?: number;
  /** ISO-8601 time the engine became healthy. */
  startedAt: string;
  /** NATS subject the worker's agent answers requests on, when the request plane is NATS. */
  natsSubject?: string;
  /**
   * The KV relay's instance id (hex) when KV events go over NATS: every batch it publishes
   * carries it (header `Infera-Kv-Epoch`). A server applies only batches stamped with the
   * epoch the record announces, and treats a sequence restart as genuine only when a new
   * record announces a new epoch (src/transport/nats/kv-subscriber.ts).
   */
  natsKvEpoch?: string;
  /** Free-form labels (zone, gpu, version). */
  labels?: Record<string, string>;
  /**
   * POST routes the engine serves beyond chat and completions, as paths (`/v1/responses`,
   * `/v1/messages`, `/v1/embeddings`, `/v1/rerank`, `/v1/score`, `/tokenize`, `/detokenize`).
   * The server sends pass-through requests only to workers that list their route, and
   * Responses / Messages requests natively to those that list theirs (translating to chat for
   * the others). Absent: none (src/server/api/README.md).
   */
  routes?: string[];
}

export type DiscoveryEvent =
  | { type: "put"; worker: WorkerRecord }
  | { type: "delete"; id: string }
  /** The backend lost its connection and is serving the last known set. */
  | { type: "degraded"; reason: string }
  | { type: "restored" };

/** Read side: what a server uses to follow the live worker set. */
export interface DiscoveryWatcher {
  /** Loads the initial set; resolves once the first list is complete. */
  start(): Promise<void>;
  /** The current live set (the last known one while degraded). */
  workers(): readonly WorkerRecord[];
  /** Subscribe to changes; returns an unsubscribe function. */
  onChange(listener: (ev: DiscoveryEvent) => void): () => void;
  /** True while the backend is unreachable and the last known (possibly empty) set is served. */
  isDegraded?(): boolean;
  close(): Promise<void>;
}

/** Write side: what a launcher uses to announce one worker. */
export interface DiscoveryRegistrar {
  /** Registers (and keeps registered, through lease loss) the record. */
  register(record: WorkerRecord): Promise<void>;
  /** Removes the record at once (graceful stop). */
  deregister(): Promise<void>;
  close(): Promise<void>;
}

export function workerKey(prefix: string, rec: Pick<WorkerRecord, "model" | "id">): string {
  return `${prefix}/workers/${encodeURIComponent(rec.model)}/${encodeURIComponent(rec.id)}`;
}
