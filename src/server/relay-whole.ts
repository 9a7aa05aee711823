/** Relaying a non-streamed worker answer: checked while small, relayed as it comes when large. */
import type { ServerResponse } from "node:http";
import { TimeoutError, UpstreamError } from "../protocol/errors.ts";
import { connectionFailureKind, contentTypeOf, type UpstreamResponse } from "../transport/types.ts";
import type { RequestAbort } from "../util/abort.ts";
import type { Logger } from "../util/log.ts";
import { pump } from "./pump.ts";
import { type Usage, usageFromJson } from "./sse.ts";

export interface WholeRelayContext {
  maxResponseBufferBytes: number;
  logger: Logger;
}

/**
 * A non-streamed answer: buffered (up to `maxResponseBufferBytes`) so that a worker's invalid
 * answer (a status outside 200..599, a body that is not a JSON object) becomes a 502 in
 * OpenAI's shape. Past the limit the answer is relayed as it arrives, with backpressure and
 * unchecked, so a few huge answers cannot hold the server's memory.
 */
export async function relayWhole(
  ctx: WholeRelayContext,
  res: ServerResponse,
  up: UpstreamResponse,
  requestId: string,
  signal: RequestAbort,
): Promise<Usage | null> {
  if (!validStatus(up.status)) {
    up.abort();
    ctx.logger.warn({ requestId, status: up.status }, "worker answered with an invalid status");
    throw invalidAnswer(`an invalid HTTP status (${up.status})`);
  }
  const relay = new WholeRelay(res, up, requestId, ctx.maxResponseBufferBytes);
  try {
    // A body's chunks are Uint8Arrays (the NATS plane hands over its messages' bytes as they
    // are): one not a Buffer is viewed as one, else a lone chunk's toString("utf8") would give
    // Uint8Array's "123,34,…" and a valid answer would be refused as invalid. (The closure is
    // not kept on the relay: see WholeRelay.)
    await pump(up.body, res, (c) =>
      relay.push(Buffer.isBuffer(c) ? c : Buffer.from(c.buffer, c.byteOffset, c.byteLength)),
    );
  } catch (err) {
    up.abort();
    throw bodyFailure(err);
  }
  if (signal.aborted) return null;
  if (relay.relaying) {
    res.end();
    return up.status === 200 ? relay.tailUsage() : null;
  }
  const buf = relay.buffered();
  let json: unknown;
  try {
    json = JSON.parse(buf.toString("utf8"));
  } catch {
    json = null;
  }
  if (json === null || typeof json !== "object" || Array.isArray(json)) {
    ctx.logger.warn(
      { requestId, status: up.status, bytes: buf.length },
      "worker answer is not a JSON object",
    );
    throw invalidAnswer(`a ${up.status} answer that is not a JSON object`);
  }
  res.writeHead(up.status, {
    "content-type": contentTypeOf(up) ?? "application/json",
    "content-length": buf.length,
    "x-request-id": requestId,
  });
  res.end(buf);
  return up.status === 200 ? usageOf(json as Record<string, unknown>) : null;
}

const validStatus = (s: number): boolean => Number.isInteger(s) && s >= 200 && s <= 599;

function invalidAnswer(what: string): UpstreamError {
  return new UpstreamError(
    `The worker sent ${what}; the answer was dropped.`,
    502,
    "upstream_invalid_response",
  );
}

function usageOf(json: Record<string, unknown>): Usage | null {
  const u = json.usage as Usage | null | undefined;
  if (!u || typeof u !== "object") return null;
  return {
    prompt_tokens: typeof u.prompt_tokens === "number" ? u.prompt_tokens : undefined,
    completion_tokens: typeof u.completion_tokens === "number" ? u.completion_tokens : undefined,
  };
}

/**
 * The buffer of one non-streamed answer, switching to relaying once it passes the limit. It
 * holds no closure over itself: such an object survived young-generation collections under
 * Node 24's Maglev tier (see ./http-util.ts `readBody`), and with it the whole request.
 */
class WholeRelay {
  private readonly res: ServerResponse;
  private readonly up: UpstreamResponse;
  private readonly requestId: string;
  private readonly limit: number;
  relaying = false;
  private chunks: Buffer[] = [];
  private size = 0;
  /** The last two chunks while relaying: the usage object sits at the end of the answer. */
  private prev: Buffer | null = null;
  private last: Buffer | null = null;

  constructor(res: ServerResponse, up: UpstreamResponse, requestId: string, limit: number) {
    this.res = res;
    this.up = up;
    this.requestId = requestId;
    this.limit = limit;
  }

  push(c: Buffer): boolean {
    if (this.relaying) {
      this.prev = this.last;
      this.last = c;
      return this.res.write(c);
    }
    this.chunks.push(c);
    this.size += c.length;
    if (this.size <= this.limit) return true;
    // Too big to hold: headers now (no content-length), then everything as it comes.
    this.relaying = true;
    this.res.writeHead(this.up.status, {
      "content-type": contentTypeOf(this.up) ?? "application/json",
      "x-request-id": this.requestId,
    });
    let ok = true;
    for (const b of this.chunks) ok = this.res.write(b);
    this.last = c;
    this.chunks = [];
    return ok;
  }

  buffered(): Buffer {
    const chunks = this.chunks;
    return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, this.size);
  }

  tailUsage(): Usage | null {
    const tail = this.prev && this.last ? Buffer.concat([this.prev, this.last]) : this.last;
    return tail ? usageFromJson(tail) : null;
  }
}

/** A worker's answer that broke off after its headers, as the typed error the client gets. */
export function bodyFailure(err: unknown): unknown {
  const code = (err as { code?: unknown })?.code;
  if (code === "UND_ERR_BODY_TIMEOUT")
    return new TimeoutError("The worker stopped sending its answer in time.");
  if (connectionFailureKind(err)) return new UpstreamError("The worker dropped the connection mid-answer.");
  return err;
}
