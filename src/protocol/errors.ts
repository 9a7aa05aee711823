/**
 * Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
 * Every module throws one of these (or a subclass) for anything a client did wrong or
 * anything the fleet cannot do right now; the HTTP layer turns it into a response.
 */
export type OpenAIErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "not_found_error"
  | "rate_limit_error"
  | "server_error"
  | "service_unavailable";

export interface OpenAIErrorBody {
  error: { message: string; type: OpenAIErrorType; param: string | null; code: string | null };
}

export class InferaError extends Error {
  readonly status: number;
  readonly type: OpenAIErrorType;
  readonly param: string | null;
  readonly code: string | null;
  /** Extra response headers, e.g. Retry-After for 503. */
  readonly headers: Record<string, string>;

  constructor(
    status: number,
    message: string,
    opts: {
      type?: OpenAIErrorType;
      param?: string | null;
      code?: string | null;
      headers?: Record<string, string>;
    } = {},
  ) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.type = opts.type ?? (status >= 500 ? "server_error" : "invalid_request_error");
    this.param = opts.param ?? null;
    this.code = opts.code ?? null;
    this.headers = opts.headers ?? {};
  }

  toJSON(): OpenAIErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export class BadRequestError extends InferaError {
  constructor(message: string, param: string | null = null, code: string | null = null) {
    super(400, message, { type: "invalid_request_error", param, code });
  }
}

export class InvalidJsonError extends InferaError {
  constructor(detail: string) {
    super(400, `We could not parse the JSON body of your request: ${detail}`, {
      type: "invalid_request_error",
      code: "invalid_json",
    });
  }
}

export class AuthenticationError extends InferaError {
  constructor(message = "Incorrect or missing API key.") {
    super(401, message, { type: "authentication_error", code: "invalid_api_key" });
  }
}

export class NotFoundError extends InferaError {
  constructor(message: string, code = "not_found", param: string | null = null) {
    super(404, message, { type: "not_found_error", param, code });
  }
}

/** Longest piece of client input echoed in an error message. */
export const MAX_ECHOED_CHARS = 256;

/**
 * Client input as quoted in an error message: cut to MAX_ECHOED_CHARS (a 3 MB model name was
 * echoed whole), with the original length noted.
 */
export function echoInput(s: string): string {
  if (s.length <= MAX_ECHOED_CHARS) return s;
  return `${s.slice(0, MAX_ECHOED_CHARS)}… (${s.length} characters)`;
}

export class ModelNotFoundError extends InferaError {
  constructor(model: string) {
    super(404, `The model \`${echoInput(model)}\` does not exist or no live worker serves it.`, {
      type: "not_found_error",
      param: "model",
      code: "model_not_found",
    });
  }
}

export class PayloadTooLargeError extends InferaError {
  constructor(limit: number) {
    super(413, `Request body exceeds the limit of ${limit} bytes.`, {
      type: "invalid_request_error",
      code: "request_too_large",
    });
  }
}

export class ContextLengthError extends InferaError {
  constructor(promptTokens: number, maxTokens: number, maxModelLen: number) {
    super(
      400,
      `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`,
      { type: "invalid_request_error", param: "messages", code: "context_length_exceeded" },
    );
  }
}

export class NoWorkerError extends InferaError {
  constructor(model: string, retryAfterSeconds = 1) {
    super(503, `No live worker is available for model \`${echoInput(model)}\`; retry shortly.`, {
      type: "service_unavailable",
      code: "no_worker_available",
      headers: { "retry-after": String(retryAfterSeconds) },
    });
  }
}

/** The server is draining (SIGTERM): a new request goes to another replica. */
export class DrainingError extends InferaError {
  constructor() {
    super(503, "This server is shutting down; retry on another replica.", {
      type: "service_unavailable",
      code: "server_draining",
      headers: { "retry-after": "1", connection: "close" },
    });
  }
}

export class UpstreamError extends InferaError {
  constructor(message: string, status = 502, code = "upstream_error") {
    super(status, message, { type: "server_error", code });
  }
}

export class TimeoutError extends InferaError {
  constructor(message: string) {
    super(504, message, { type: "server_error", code: "timeout" });
  }
}

/** Wraps anything thrown into an InferaError without leaking internals to clients. */
export function toInferaError(err: unknown): InferaError {
  if (err instanceof InferaError) return err;
  return new InferaError(500, "Internal server error.", { type: "server_error", code: "internal_error" });
}
