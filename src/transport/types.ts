/**
 * The request plane's contract, between the routers (which pick workers) and the transports
 * (HTTP, NATS) that carry a request to one: the executor, the answer it gives back, the body
 * the server relays, and the failure kinds the circuit breaker counts. Routers and the server
 * depend on this module only, never on a transport's implementation.
 *
 * Besides types it holds the one typed error every executor raises for an unreachable worker,
 * the classifiers and guards over these types, and the registry of a request body's bytes
 * (`setRawBody` / `rawBodyOf` / `appendFields`): each is a few lines, and keeping them with
 * the contract spares the routers an import of any implementation.
 */
import type { Readable } from "node:stream";
import type { WorkerRecord } from "../discovery/types.ts";
import { InferaError, UpstreamError } from "../protocol/errors.ts";
import type { AbortLike } from "../util/abort.ts";

/**
 * The engine routes a request can go to. `chat` and `completion` are routed by the scheduling
 * pipeline; `responses` and `messages` go to an engine that serves them natively; the others
 * are pass-through routes (src/server/api/passthrough.ts). Paths as the engines serve them:
 * vLLM vllm/entrypoints/openai/responses/api_router.py @ f6e93254b87059a005c9043f4c72322994aff95a
 * (`/v1/responses`), vllm/entrypoints/anthropic/api_router.py @
 * 01540b75e3b1c58a3bf586ee6defbdde6e0a2c1b (`/v1/messages`); SGLang
 * python/sglang/srt/entrypoints/http_server.py @ 0025436eab0556737d615b36a4dd3e1e26e82f3d
 * (`/v1/responses`, `/v1/rerank`, `/v1/score`, `/tokenize`, `/detokenize`; vLLM serves the same
 * pooling and tokenizer paths).
 */
export type EndpointKind =
  | "chat"
  | "completion"
  | "responses"
  | "messages"
  | "embeddings"
  | "rerank"
  | "score"
  | "tokenize"
  | "detokenize";

/** The endpoints the scheduling pipeline routes (a prompt to place on a worker). */
export type RoutedEndpoint = "chat" | "completion";

export const ENDPOINT_PATHS: Readonly<Record<EndpointKind, string>> = {
  chat: "/v1/chat/completions",
  completion: "/v1/completions",
  responses: "/v1/responses",
  messages: "/v1/messages",
  embeddings: "/v1/embeddings",
  rerank: "/v1/rerank",
  score: "/v1/score",
  tokenize: "/tokenize",
  detokenize: "/detokenize",
};

/** The endpoint a wire name (a NATS header) names, or undefined. */
export function endpointKindOf(name: string | undefined): EndpointKind | undefined {
  return name !== undefined && Object.hasOwn(ENDPOINT_PATHS, name) ? (name as EndpointKind) : undefined;
}

/** What an executor needs of a worker: its discovery record (URL, NATS subject, model). */
export interface SendTarget {
  readonly record: WorkerRecord;
}

export interface SendOptions {
  signal: AbortLike;
  headers?: Record<string, string>;
  /** Per-phase timeout; the executor aborts and throws TimeoutError past it. */
  timeoutMs?: number;
}

/** An upstream answer: status, headers and a byte stream, whatever the transport. */
export interface UpstreamResponse {
  status: number;
  headers: Record<string, string>;
  /** The content-type header, when the transport can give it without building `headers`. */
  readonly contentType?: string;
  /** Any AsyncIterable; a `RelayBody` (see `isRelayBody`) is relayed without a promise per chunk. */
  body: AsyncIterable<Uint8Array>;
  /** Reads the whole body as JSON (non-streamed answers). */
  json(): Promise<unknown>;
  /** Aborts the upstream request; idempotent. */
  abort(): void;
}

/** Provided by the server: sends a body to a worker over the configured request plane. */
export interface RequestExecutor {
  send(
    worker: SendTarget,
    endpoint: EndpointKind,
    body: Record<string, unknown>,
    opts: SendOptions,
  ): Promise<UpstreamResponse>;
}

// --- request bodies as bytes ------------------------------------------------------------

// The bytes a request body goes out as, when the server already has them: the client's own
// bytes for a body it forwards unchanged, or those bytes with a few top-level fields appended
// (a PD half). The HTTP executor sends them instead of `JSON.stringify(body)`, which for a long
// prompt costs milliseconds of the event loop per send.
//
// Appended fields rely on the engines' JSON parser keeping the LAST of duplicate keys, so that
// an appended field overrides the client's. vLLM, SGLang and ATOM take their OpenAI bodies as
// FastAPI body parameters, which FastAPI reads with Starlette's `Request.json()`, i.e. Python's
// `json.loads` (last duplicate wins): fastapi/fastapi fastapi/routing.py @
// da166b7967e7ec404be8053c39147b07887da45d (`json_body = await request.json()`), encode/starlette
// starlette/requests.py @ 0012249bd6dbfefcd114a87f52fec4143e81d60a (`json.loads(body)`);
// vllm-project/vllm vllm/entrypoints/openai/chat_completion/api_router.py @
// c0bc59655a4068c08621bcac8ab67b39cd2ec173, sgl-project/sglang
// python/sglang/srt/entrypoints/http_server.py @ 0025436eab0556737d615b36a4dd3e1e26e82f3d,
// ROCm/ATOM atom/entrypoints/openai/api_server.py @ 9a43d693f147a090ce983b82c7110c0ff61dcd42.
// JSON.parse (the simulator, this server) keeps the last one too.

/** Keyed by the body object: a body built anew without registered bytes is serialised. */
const rawBodies = new WeakMap<object, Buffer>();

/**
 * Marks `raw` as what `body` is sent as: bytes that parse (last duplicate key winning) to what
 * `body` means to the engine. The caller must not mutate `body` after.
 */
export function setRawBody(body: object, raw: Buffer): void {
  rawBodies.set(body, raw);
}

/** The registered bytes of `body`, if any. */
export function rawBodyOf(body: object): Buffer | undefined {
  return rawBodies.get(body);
}

const isJsonSpace = (c: number | undefined) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/**
 * `raw` (a JSON object's bytes) with `fields` appended as top-level members before its closing
 * brace, in order; undefined values are skipped. Null when `raw` is not an object's bytes.
 * Only the appended values are serialised.
 */
export function appendFields(raw: Buffer, fields: Readonly<Record<string, unknown>>): Buffer | null {
  let end = raw.length - 1;
  while (end >= 0 && isJsonSpace(raw[end])) end--;
  let start = 0;
  while (start < end && isJsonSpace(raw[start])) start++;
  if (end <= start || raw[start] !== 0x7b || raw[end] !== 0x7d) return null;
  let first = start + 1;
  while (first < end && isJsonSpace(raw[first])) first++;
  let tail = "";
  for (const k in fields) {
    const v = fields[k];
    if (v === undefined) continue;
    tail += `,${JSON.stringify(k)}:${JSON.stringify(v)}`;
  }
  if (tail === "") return raw;
  // An empty object takes the members without the leading comma.
  if (first === end) tail = tail.slice(1);
  const add = Buffer.from(tail);
  const out = Buffer.allocUnsafe(raw.length + add.length);
  raw.copy(out, 0, 0, end);
  add.copy(out, end);
  raw.copy(out, end + add.length, end);
  return out;
}

// --- answer bodies ----------------------------------------------------------------------

/** The one consumer of a `RelayBody`, called in order: onData* then onEnd or onError, once. */
export interface BodySink {
  /** Returns false to pause the source until the body's `resume()`. */
  onData(chunk: Uint8Array): boolean;
  onEnd(): void;
  onError(err: Error): void;
}

/**
 * A body its transport pushes chunk by chunk into one attached sink: the server relays it with
 * plain calls (no promise per chunk), and whoever holds a claim on the worker learns of its end
 * through `onClose` without wrapping it. The HTTP executor's bodies are these.
 */
export interface RelayBody extends AsyncIterable<Uint8Array> {
  /** Attaches the one consumer; what arrived before is replayed to it at once. */
  attach(sink: BodySink): void;
  /** After the sink's `onData` returned false: let the source go on. */
  resume(): void;
  /** Runs `fn` once the body ended, failed or was destroyed (at once if it already has). */
  onClose(fn: () => void): void;
  /** The consumer gives up: the transfer stops and an attached sink sees the error. */
  destroy(reason?: Error): void;
}

/** Whether an answer's body can be relayed through `attach` (a `RelayBody`). */
export function isRelayBody(b: AsyncIterable<Uint8Array>): b is RelayBody {
  return typeof (b as RelayBody).attach === "function";
}

/** Whether a body is a Node `Readable` (pumped with events rather than for-await). */
export function isReadable(b: AsyncIterable<Uint8Array>): b is Readable {
  return typeof (b as Readable).on === "function" && typeof (b as Readable).pause === "function";
}

/** An answer's content type: its `contentType` when the transport gives one, else from `headers`. */
export function contentTypeOf(up: UpstreamResponse): string | undefined {
  return "contentType" in up ? up.contentType : up.headers["content-type"];
}

// --- failures ---------------------------------------------------------------------------

/** `connect`: nothing reached the worker (refused, unreachable); `reset`: it dropped the connection. */
export type ConnectionFailureKind = "connect" | "reset";

/** What the circuit breaker counts against a worker: connection failures and server errors, never 4xx. */
export type FailureKind = ConnectionFailureKind | "5xx";

/** The worker could not be reached, or dropped the connection before the first response byte. */
export class WorkerUnreachableError extends UpstreamError {
  readonly url: string;
  readonly kind: ConnectionFailureKind;
  readonly detail: string;
  constructor(url: string, kind: ConnectionFailureKind, detail: string) {
    super(`Worker ${url} is unreachable (${detail}).`, 502, "worker_unreachable");
    this.url = url;
    this.kind = kind;
    this.detail = detail;
  }
}

const CONNECT_CODES = new Set([
  "ECONNREFUSED",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "UND_ERR_CONNECT_TIMEOUT",
]);
const RESET_CODES = new Set(["ECONNRESET", "EPIPE", "ETIMEDOUT", "UND_ERR_SOCKET", "UND_ERR_CLOSED"]);

/** A socket-level error's kind, from its `code` or its causes' (undici nests them); else null. */
export function connectionFailureKind(err: unknown): ConnectionFailureKind | null {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined, depth = 0; e && depth < 4; depth++) {
    if (typeof e.code === "string") {
      if (CONNECT_CODES.has(e.code)) return "connect";
      if (RESET_CODES.has(e.code)) return "reset";
    }
    e = e.cause as typeof e;
  }
  return null;
}

/**
 * A send's failure as a connection failure (the worker was never reached or dropped the
 * connection before answering): the only failures a request may be retried on elsewhere.
 */
export function connectionKindOf(err: unknown): ConnectionFailureKind | null {
  return err instanceof WorkerUnreachableError ? err.kind : connectionFailureKind(err);
}

/**
 * Any failure as the breaker sees it: connection failures, and typed errors of status ≥ 500
 * (timeouts, broken answers) as `5xx`; everything else (4xx, plain errors) is not the worker's.
 */
export function failureKind(err: unknown): FailureKind | null {
  if (err instanceof WorkerUnreachableError) return err.kind;
  if (err instanceof InferaError) return err.status >= 500 ? "5xx" : null;
  return connectionFailureKind(err);
}
