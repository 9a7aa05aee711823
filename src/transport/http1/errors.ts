/**
 * The raw HTTP/1.1 client's errors. Their `code`s are the ones undici and llhttp give for the
 * same failures (`UND_ERR_SOCKET`, `UND_ERR_HEADERS_TIMEOUT`, `HPE_*`, …), so that everything
 * downstream that classifies a failure (`connectionFailureKind` in ../types.ts, the executor's
 * `classify`, the relay's `bodyFailure`) treats an answer the same whichever client carried it.
 */

/** A failure with the code undici would have given it. */
export class Http1Error extends Error {
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.name = "Http1Error";
    this.code = code;
  }
}

/** The worker's answer broke HTTP/1.1 framing (llhttp's `HPE_*` codes). */
export class ParseError extends Http1Error {
  constructor(code: string, message: string) {
    super(code, message);
    this.name = "HTTPParserError";
  }
}

/** The worker closed or reset the connection before the answer ended. */
export const socketClosed = (): Http1Error => new Http1Error("UND_ERR_SOCKET", "other side closed");
export const headersTimeout = (): Http1Error =>
  new Http1Error("UND_ERR_HEADERS_TIMEOUT", "Headers Timeout Error");
export const bodyTimeout = (): Http1Error => new Http1Error("UND_ERR_BODY_TIMEOUT", "Body Timeout Error");
export const connectTimeout = (): Http1Error =>
  new Http1Error("UND_ERR_CONNECT_TIMEOUT", "Connect Timeout Error");
export const poolClosed = (): Http1Error => new Http1Error("UND_ERR_CLOSED", "The client is closed");
export const poolDestroyed = (): Http1Error => new Http1Error("UND_ERR_DESTROYED", "The client is destroyed");
export const invalidArg = (what: string): Http1Error => new Http1Error("UND_ERR_INVALID_ARG", what);
