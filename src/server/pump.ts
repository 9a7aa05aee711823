/**
 * Pumps a worker's answer body into a callback with backpressure: a relay body (the HTTP
 * executor's) with plain calls, a Node stream with events, anything else with for-await.
 */
import type { ServerResponse } from "node:http";
import type { Readable } from "node:stream";
import { type BodySink, isReadable, isRelayBody, type RelayBody } from "../transport/types.ts";

/**
 * Feeds every chunk of `body` to `onChunk`; when it returns false (the client's socket is
 * full) reading pauses until `res` drains. Node stream bodies are pumped with events (no
 * promise per chunk); any other AsyncIterable with for-await.
 */
export function pump(
  body: AsyncIterable<Uint8Array>,
  res: ServerResponse | null,
  onChunk: (c: Uint8Array) => boolean,
): Promise<void> {
  // Not an async function: the relay body's promise is the answer's (an async wrapper was one
  // more promise and microtask per request).
  if (isRelayBody(body)) {
    return new Promise<void>((resolve, reject) =>
      body.attach(new SinkPump(body, res, onChunk, resolve, reject)),
    );
  }
  if (!isReadable(body)) return pumpIterable(body, res, onChunk);
  return pumpEvents(body, res, onChunk);
}

async function pumpIterable(
  body: AsyncIterable<Uint8Array>,
  res: ServerResponse | null,
  onChunk: (c: Uint8Array) => boolean,
): Promise<void> {
  for await (const c of body) if (!onChunk(c) && res) await drained(res);
}

/** Relays a relay body (the HTTP executor's) with plain calls: pause on a full socket, resume on drain. */
class SinkPump implements BodySink {
  private readonly body: RelayBody;
  private readonly res: ServerResponse | null;
  private readonly onChunk: (c: Uint8Array) => boolean;
  readonly onEnd: () => void;
  readonly onError: (err: Error) => void;
  constructor(
    body: RelayBody,
    res: ServerResponse | null,
    onChunk: (c: Uint8Array) => boolean,
    onEnd: () => void,
    onError: (err: Error) => void,
  ) {
    this.body = body;
    this.res = res;
    this.onChunk = onChunk;
    this.onEnd = onEnd;
    this.onError = onError;
  }

  onData(chunk: Uint8Array): boolean {
    if (this.onChunk(chunk) || !this.res) return true;
    const body = this.body;
    void drained(this.res).then(() => body.resume());
    return false;
  }
}

/**
 * Pumps a Node stream with its events: pause on a full socket, resume on drain. 'close'
 * follows end, error and destroy; a close before the end is an upstream failure.
 */
function pumpEvents(
  body: Readable,
  res: ServerResponse | null,
  onChunk: (c: Uint8Array) => boolean,
): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const onData = (c: Uint8Array) => {
      if (!onChunk(c) && res) {
        body.pause();
        void drained(res).then(() => body.resume());
      }
    };
    const onEnd = () => {
      cleanup();
      resolve();
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    const onClose = () => {
      cleanup();
      if (body.readableEnded) resolve();
      else reject(Object.assign(new Error("upstream body closed early"), { code: "UND_ERR_SOCKET" }));
    };
    const cleanup = () => {
      body.off("data", onData);
      body.off("end", onEnd);
      body.off("error", onError);
      body.off("close", onClose);
    };
    body.on("data", onData);
    body.once("end", onEnd);
    body.once("error", onError);
    body.once("close", onClose);
  });
}

function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}
