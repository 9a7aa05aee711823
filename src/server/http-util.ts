/** Small HTTP helpers for the node:http server: bounded body reading and OpenAI-shaped errors. */
import type { IncomingMessage, ServerResponse } from "node:http";
import { InferaError, PayloadTooLargeError, toInferaError } from "../protocol/errors.ts";

export class BodyAbortedError extends Error {}

/**
 * Reads a request body up to `limit` bytes. Rejects with PayloadTooLargeError as soon as the
 * declared or received size passes the limit, and with BodyAbortedError when the client
 * goes away mid-upload.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = req.headers["content-length"];
  if (declared !== undefined && Number(declared) > limit) {
    return Promise.reject(new PayloadTooLargeError(limit));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (err: Error | null, buf?: Buffer) => {
      if (done) return;
      done = true;
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
      if (err) reject(err);
      else resolve(buf!);
    };
    const onData = (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        finish(new PayloadTooLargeError(limit));
        return;
      }
      chunks.push(c);
    };
    const onEnd = () => finish(null, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    const onError = () => finish(new BodyAbortedError("request body aborted"));
    const onClose = () => {
      if (!req.complete) finish(new BodyAbortedError("request body aborted"));
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers?: Record<string, string>,
): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

/** Answers with an OpenAI-shaped error, or just closes the stream if headers are already out. */
export function sendError(res: ServerResponse, err: unknown, requestId?: string): void {
  const e = err instanceof InferaError ? err : toInferaError(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const headers: Record<string, string> = { ...e.headers };
  if (requestId) headers["x-request-id"] = requestId;
  if (e.status === 413) headers.connection = "close";
  sendJson(res, e.status, e.toJSON(), headers);
}
