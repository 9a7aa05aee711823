/**
 * What a completion request forwards to the worker: the client's own bytes where the body was
 * taken as parsed, with `stream_options.include_usage` added to every stream.
 */
import type { ChatCompletionRequest, CompletionRequest } from "../protocol/openai.ts";
import { setRawBody } from "../transport/types.ts";
import { isLent } from "./body-buffers.ts";

/**
 * Sets the bytes `body` is forwarded as. Every stream asks for usage so the server's token
 * metrics are complete (the proxy removes the usage chunk again when the client did not ask
 * for it). Fast-path bodies (`parsed` itself) are forwarded as the client's bytes `raw`, with
 * the one added field spliced in before the closing brace; anything else is re-serialised.
 * Returns whether the client asked for usage itself.
 */
export function setForwardBody(
  body: ChatCompletionRequest | CompletionRequest,
  parsed: unknown,
  raw: Buffer,
): boolean {
  const stream = body.stream === true;
  const clientWantsUsage = stream && body.stream_options?.include_usage === true;
  if (stream && !clientWantsUsage) {
    const had = body.stream_options !== undefined;
    body.stream_options = { ...body.stream_options, include_usage: true };
    if (body === parsed && !had) setRawBody(body, withIncludeUsage(raw));
  } else if (body === parsed) setRawBody(body, raw);
  return clientWantsUsage;
}

const INCLUDE_USAGE = Buffer.from(',"stream_options":{"include_usage":true}');

/**
 * `raw` (a JSON object with at least one member) with `stream_options` appended as its last
 * member. A pooled body has room after its bytes (its buffer is a power of two): the field is
 * spliced in place, only the bytes after the closing brace moving, where a copy of a 1 MB
 * body was one more fresh megabyte per streamed request.
 */
function withIncludeUsage(raw: Buffer): Buffer {
  const close = raw.lastIndexOf(0x7d); // "}"
  const length = raw.length + INCLUDE_USAGE.length;
  if (raw.byteOffset === 0 && raw.buffer.byteLength >= length && isLent(raw.buffer)) {
    const out = Buffer.from(raw.buffer, 0, length);
    out.copyWithin(close + INCLUDE_USAGE.length, close, raw.length);
    INCLUDE_USAGE.copy(out, close);
    return out;
  }
  return Buffer.concat([raw.subarray(0, close), INCLUDE_USAGE, raw.subarray(close)]);
}
