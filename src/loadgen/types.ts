/**
 * Shared types of `infera bench`: the requests a workload produces, what the client measures
 * for each one, and the options of a run. The JSON output schema lives in ./schema.ts.
 */

export interface BenchMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

/** One request of a workload, fixed before the run starts (so the same seed gives the same run). */
export interface BenchRequest {
  /** Position in the workload, 0-based; also the key of its result. */
  index: number;
  /** Chat messages (chat endpoint). When the completions endpoint is used they are rendered with ChatML. */
  messages?: BenchMessage[];
  /** Raw prompt (completions endpoint). On the chat endpoint it becomes one user message. */
  prompt?: string;
  maxTokens: number;
  /** Arrival offset from the start of the run, in ms; set for traces with timestamps. */
  arrivalMs?: number;
  /** Multi-turn: this request is sent only after request `after` has finished (the previous turn). */
  after?: number;
  /**
   * Multi-turn with the server's actual replies: message `messageIndex` of this request is replaced
   * by the reply text of request `requestIndex` once that request has finished (if it succeeded).
   */
  replyRefs?: Array<{ messageIndex: number; requestIndex: number }>;
  /** Groups requests for reports, e.g. "conv-3" or "doc-1". */
  group?: string;
  /** Extra body fields merged into the OpenAI body (e.g. cache_salt, kv_transfer_params). */
  extraBody?: Record<string, unknown>;
}

export type ErrorKind =
  /** HTTP status other than 2xx: the kind is `http_<status>`. */
  | `http_${number}`
  /** Could not connect, or the connection broke before the answer was complete. */
  | "connection"
  /** The per-request timeout fired. */
  | "timeout"
  /** A 2xx answer we could not parse: bad JSON, an SSE stream without [DONE], no choices. */
  | "malformed"
  /** A 2xx stream that carried an `error` object instead of (or after) tokens. */
  | "stream_error"
  /** The run was cancelled (signal) while the request was in flight. */
  | "cancelled";

/** What the client measured for one request. Times in ms; `start_ms` relative to the run start. */
export interface RequestRecord {
  index: number;
  group: string | null;
  ok: boolean;
  error: ErrorKind | null;
  error_message: string | null;
  start_ms: number;
  /** Time to first token (first chunk with content); equals e2e for non-streamed requests. */
  ttft_ms: number | null;
  e2e_ms: number | null;
  /** Gaps between successive content chunks (streamed requests only). */
  itl_ms: number[];
  /** (e2e - ttft) / (completion tokens - 1), when there are ≥ 2 tokens. */
  tpot_ms: number | null;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  cached_tokens: number | null;
  /** True when the answer carried a `usage` object (else token counts are estimated or null). */
  usage_reported: boolean;
  /** Number of content chunks received (streamed), 1 for a non-streamed answer. */
  chunks: number;
}

export interface SloSpec {
  ttft_ms?: number;
  /** Compared against each request's mean inter-token latency (TPOT). */
  itl_ms?: number;
  e2e_ms?: number;
}

export type Endpoint = "chat" | "completions";

export interface ProgressUpdate {
  done: number;
  total: number;
  ok: number;
  errors: number;
  inFlight: number;
  elapsedMs: number;
}
