/**
 * The one dispatch path every router builds on. A `WorkerClaim` is one request's hold on one
 * worker: counted in the worker's `inFlight` (and its prompt in `pendingPrefillTokens`) from
 * the moment the router picks it, so concurrent picks see it before any await, until it is
 * released, exactly once. It sends through the request plane (`send`), tells the circuit
 * breaker what the worker did (`send` itself for connection failures and 5xx answers,
 * `fail` / `succeed` for what only the router can judge), and wraps the answer (`wrap`) so
 * the claim ends with the answer however that ends: body end, failure or destroy, `json()`,
 * `abort()`. The prompt's tokens leave `pendingPrefillTokens` at the answer's first byte.
 * Watchers (`watch`, the policy's pending bridge) hear once how the prompt's prefill ended:
 * `prefilled` at the first byte of an answer below 400 (or a whole answer read by `json()`),
 * else `dropped` when the claim ends: `cancelled` if the caller aborted, `failed` otherwise.
 *
 * The MixedRouter's attempts and the DisaggRouter's prefill and decode halves are claims; the
 * routers keep only their own decisions (which worker, when to retry, what a failure means).
 */
import {
  type BodySink,
  connectionKindOf,
  contentTypeOf,
  type EndpointKind,
  type FailureKind,
  failureKind,
  isReadable,
  isRelayBody,
  type RelayBody,
  type RequestExecutor,
  type SendOptions,
  type UpstreamResponse,
} from "../transport/types.ts";
import type { RequestTrace, UpstreamRole, UpstreamSpan } from "./trace.ts";
import type { ClaimWatcher, RouteLifecycle, WorkerState } from "./types.ts";

/** Where a claim reports what its worker did: the circuit breaker's inputs. Both optional. */
export interface HealthReporter {
  reportFailure?(worker: WorkerState, kind: FailureKind): void;
  reportSuccess?(worker: WorkerState): void;
}

/**
 * One request's claim on a worker. `releaser` makes the closure that close listeners and
 * promise callbacks take, only where one is needed (the streamed-chunks path never needs one).
 */
export class WorkerClaim implements RouteLifecycle {
  readonly worker: WorkerState;
  private readonly health: HealthReporter;
  private readonly prefillTokens;
  private released = false;
  private prefillPending: boolean;
  /** A failure was reported for this claim: it counts once against the worker. */
  private judged = false;
  /** The answer's status once `send` has one (0 before). */
  private status = 0;
  private cancelled = false;
  /** The prompt's prefill is known done (watchers told). */
  private prefillDone = false;
  private watchers: ClaimWatcher[] | null = null;
  /** `json()` is reading the answer: the body's close waits for it (see `holdWhile`). */
  private holding = false;
  /** The attempt's span when the request is traced (`traceAs`); ends with the claim. */
  private span: UpstreamSpan | null = null;
  private spanTrace: RequestTrace | null = null;
  private spanRole: UpstreamRole = "mixed";

  /** Claims `worker` at once: `inFlight`, `routed` (where kept) and `prefillTokens` pending prefill. */
  constructor(worker: WorkerState, health: HealthReporter, prefillTokens = 0) {
    this.worker = worker;
    this.health = health;
    this.prefillTokens = prefillTokens;
    worker.inFlight++;
    if (worker.routed !== undefined) worker.routed++;
    worker.pendingPrefillTokens += prefillTokens;
    this.prefillPending = prefillTokens > 0;
  }

  /**
   * Traces the claim's attempt as `role` under `t`: `send` opens an `upstream` span, sends its
   * `traceparent`, and the claim's end ends it. Only called for traced requests.
   */
  traceAs(t: RequestTrace, role: UpstreamRole): this {
    this.spanTrace = t;
    this.spanRole = role;
    return this;
  }

  /** True once the claim ended. */
  get isReleased(): boolean {
    return this.released;
  }

  /** True while the first byte is still awaited (pending prefill counted, or watchers to tell). */
  get isPrefillPending(): boolean {
    return this.prefillPending || (this.watchers !== null && !this.prefillDone);
  }

  /** Tells `w` how the prompt's prefill ends (at once when it already has). */
  watch(w: ClaimWatcher): void {
    if (this.prefillDone) w.prefilled();
    else if (this.released) w.dropped(this.cancelled ? "cancelled" : "failed");
    else if (this.watchers === null) this.watchers = [w];
    else this.watchers.push(w);
  }

  /** The worker produced its first byte: its prefill is done (idempotent). */
  firstByte(): void {
    this.endPending();
    if (this.prefillDone || this.released || this.status >= 400) return;
    this.prefillDone = true;
    const ws = this.watchers;
    this.watchers = null;
    if (ws) for (const w of ws) w.prefilled();
  }

  /** The caller gave up (client abort): the claim ends as cancelled. */
  cancel(): void {
    this.noteCancel();
    this.holding = false;
    this.release();
  }

  /** The caller is giving up: whatever ends the claim next ends it as cancelled. */
  noteCancel(): void {
    if (!this.released) this.cancelled = true;
  }

  /**
   * Runs `read` (the answer's `json()`) with the claim held: the body's close, which comes before
   * the parse resolves, does not end it; a parsed answer below 400 is a done prefill; then the
   * claim ends. (A relay body that closed before `json()` was called has already ended the
   * claim, its watchers told `dropped`; no router reads a wrapped answer that way.)
   */
  async holdWhile<T>(read: () => Promise<T>): Promise<T> {
    this.holding = true;
    try {
      const v = await read();
      this.holding = false;
      this.firstByte();
      return v;
    } finally {
      this.holding = false;
      this.release();
    }
  }

  /** Ends the claim (idempotent): the worker's counts drop by what it added. */
  release(): void {
    if (this.released || this.holding) return;
    this.released = true;
    this.endPending();
    this.worker.inFlight--;
    if (this.span !== null) this.span.end(this.cancelled ? "cancelled" : undefined);
    const ws = this.watchers;
    this.watchers = null;
    if (ws && !this.prefillDone) for (const w of ws) w.dropped(this.cancelled ? "cancelled" : "failed");
  }

  private endPending(): void {
    if (this.prefillPending) {
      this.prefillPending = false;
      this.worker.pendingPrefillTokens -= this.prefillTokens;
    }
  }

  /**
   * `release` as a closure, for close listeners and promise callbacks. Not kept on the claim:
   * an object holding a closure over itself survived young-generation collections under
   * Node 24's Maglev tier (see src/server/http-util.ts `readBody`), and with it the request.
   */
  releaser(): () => void {
    return () => this.release();
  }

  /**
   * Sends through the request plane. A rejection ends the claim (nothing is held) and, unless
   * the caller aborted, counts a connection failure against the worker; the original error is
   * rethrown (`connectionKindOf` tells whether it may be retried elsewhere). An answer of
   * status ≥ 500 counts as a `5xx`; the claim stays until the answer is wrapped or released.
   */
  async send(
    exec: RequestExecutor,
    endpoint: EndpointKind,
    body: Record<string, unknown>,
    opts: SendOptions,
  ): Promise<UpstreamResponse> {
    let up: UpstreamResponse;
    if (this.spanTrace !== null) {
      this.span = this.spanTrace.upstream(this.spanRole, this.worker, opts.headers ?? {});
      opts = { ...opts, headers: this.span.headers };
    }
    try {
      up = await exec.send(this.worker, endpoint, body, opts);
    } catch (err) {
      this.span?.end(err);
      if (opts.signal.aborted) this.cancelled = true;
      this.release();
      if (!opts.signal.aborted) {
        const kind = connectionKindOf(err);
        if (kind !== null) this.report(kind);
      }
      throw err;
    }
    this.status = up.status;
    this.span?.status(up.status);
    if (up.status >= 500) this.report("5xx");
    return up;
  }

  /**
   * Counts `err` against the worker as the breaker sees it (`failureKind`: connection
   * failures, typed errors ≥ 500), unless a failure was already counted for this claim.
   */
  fail(err: unknown): void {
    const kind = failureKind(err);
    if (kind !== null) this.report(kind);
  }

  /** The worker gave a usable answer. */
  succeed(): void {
    this.health.reportSuccess?.(this.worker);
  }

  /**
   * The answer, holding the claim until it ends however it ends; `onAbort` runs when the
   * answer is aborted (the server's client went away), e.g. to cancel a request's other half.
   */
  wrap(up: UpstreamResponse, onAbort?: () => void): UpstreamResponse {
    return new ClaimedAnswer(up, this, onAbort);
  }

  private report(kind: FailureKind): void {
    if (this.judged) return;
    this.judged = true;
    this.health.reportFailure?.(this.worker, kind);
  }
}

/**
 * An answer that ends its claim exactly once. Relay bodies (the HTTP executor's) and Node
 * streams are handed through unwrapped where possible, so the server relays them with plain
 * calls or events instead of a promise per chunk; their close ends the claim.
 */
class ClaimedAnswer implements UpstreamResponse {
  private readonly up: UpstreamResponse;
  private readonly claim: WorkerClaim;
  private readonly onAbort: (() => void) | undefined;
  readonly status: number;
  readonly body: AsyncIterable<Uint8Array>;

  constructor(up: UpstreamResponse, claim: WorkerClaim, onAbort: (() => void) | undefined) {
    this.up = up;
    this.claim = claim;
    this.onAbort = onAbort;
    this.status = up.status;
    const src = up.body;
    if (isRelayBody(src)) {
      // onClose follows end, failure or destroy; the first byte is seen by a thin sink.
      if (claim.isPrefillPending) {
        const fb = new FirstByteBody(src, claim);
        src.onClose(() => fb.closed());
        this.body = fb;
      } else {
        src.onClose(claim.releaser());
        this.body = src;
      }
    } else if (!claim.isPrefillPending && isReadable(src)) {
      // 'close' follows end, error or destroy.
      src.once("close", claim.releaser());
      this.body = src;
    } else {
      this.body = claimedChunks(src, claim);
    }
  }

  // Getters: the wrapped answer may build its headers lazily.
  get headers(): Record<string, string> {
    return this.up.headers;
  }

  get contentType(): string | undefined {
    return contentTypeOf(this.up);
  }

  json(): Promise<unknown> {
    return this.claim.holdWhile(() => this.up.json());
  }

  abort(): void {
    // Marked first: aborting the body closes it, and its close ends the claim.
    this.claim.noteCancel();
    this.up.abort();
    this.onAbort?.();
    this.claim.cancel();
  }
}

/** How long a claim whose answer closed before anyone read it waits for a reader (then it ends). */
const EARLY_CLOSE_MS = 10_000;

/** A relay body whose first chunk ends its claim's pending prefill; everything else is passed on. */
class FirstByteBody implements RelayBody, BodySink {
  private readonly src: RelayBody;
  private readonly claim: WorkerClaim;
  private sink: BodySink | null = null;
  /** Set while the source has closed before a reader attached (see `closed`). */
  private early: ReturnType<typeof setTimeout> | null = null;
  /** Read by async iteration (the iterator reads the source itself). */
  private reading = false;

  constructor(src: RelayBody, claim: WorkerClaim) {
    this.src = src;
    this.claim = claim;
  }

  attach(sink: BodySink): void {
    this.sink = sink;
    this.src.attach(this);
    // Closed before this reader came: the queued chunks (the first byte among them) and the end
    // were replayed by the attach above; now the claim ends.
    this.settleEarly();
  }

  /** Ends the claim if its source closed before the reader came (see `closed`). */
  private settleEarly(): void {
    if (this.early !== null) {
      clearTimeout(this.early);
      this.early = null;
      this.claim.release();
    }
  }

  /**
   * The source closed. A short answer often arrives whole (head, chunks and end in one socket
   * read) before the relay attaches: its chunks wait in the body, and ending the claim now
   * would tell the watchers `dropped` for an answer that succeeded (the pending bridge dropped
   * its entry, the TTFT predictor lost the sample). Then the claim ends when the reader attaches
   * (after the replay), or after `EARLY_CLOSE_MS` if none ever does.
   */
  closed(): void {
    if (this.sink !== null || this.reading) this.claim.release();
    else if (this.early === null) {
      this.early = setTimeout(this.claim.releaser(), EARLY_CLOSE_MS);
      this.early.unref?.();
    }
  }

  onData(chunk: Uint8Array): boolean {
    this.claim.firstByte();
    return this.sink!.onData(chunk);
  }

  onEnd(): void {
    this.sink!.onEnd();
  }

  onError(err: Error): void {
    this.sink!.onError(err);
  }

  resume(): void {
    this.src.resume();
  }

  onClose(fn: () => void): void {
    this.src.onClose(fn);
  }

  destroy(reason?: Error): void {
    this.src.destroy(reason);
  }

  [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    this.reading = true;
    return firstByteChunks(this.src, this.claim, () => this.settleEarly());
  }
}

async function* firstByteChunks(
  src: AsyncIterable<Uint8Array>,
  claim: WorkerClaim,
  done: () => void,
): AsyncGenerator<Uint8Array> {
  try {
    for await (const chunk of src) {
      claim.firstByte();
      yield chunk;
    }
  } finally {
    done();
  }
}

/** Any other body: iterated through, the claim ending when the iteration does. */
async function* claimedChunks(
  src: AsyncIterable<Uint8Array>,
  claim: WorkerClaim,
): AsyncGenerator<Uint8Array> {
  try {
    for await (const chunk of src) {
      claim.firstByte();
      yield chunk;
    }
  } finally {
    claim.release();
  }
}
