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
export async function pump(
  body: AsyncIterable<Uint8Array>,
  res: ServerResponse | null,
  onChunk: (c: Uint8Array) => boolean,
): Promise<void> {
  if (isRelayBody(body)) {
    await new Promise<void>((resolve, reject) =>
      body.attach(new SinkPump(body, res, onChunk, resolve, reject)),
    );
    return;
  }
  if (!isReadable(body)) {
    for await (const c of body) if (!onChunk(c) && res) await drained(res);
    return;
  }
  await new Promise<void>((resolve, reject) => new EventPump(body, res, onChunk, resolve, reject).start());
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

/** The event listeners of one pumped body (assigned in the constructor: no per-request `__name` under tsx). */
class EventPump {
  private readonly body: Readable;
  private readonly onData: (c: Uint8Array) => void;
  private readonly onEnd: () => void;
  private readonly onError: (err: Error) => void;
  private readonly onClose: () => void;

  constructor(
    body: Readable,
    res: ServerResponse | null,
    onChunk: (c: Uint8Array) => boolean,
    resolve: () => void,
    reject: (err: Error) => void,
  ) {
    this.body = body;
    this.onData = (c) => {
      if (!onChunk(c) && res) {
        body.pause();
        void drained(res).then(() => body.resume());
      }
    };
    this.onEnd = () => {
      this.cleanup();
      resolve();
    };
    this.onError = (err) => {
      this.cleanup();
      reject(err);
    };
    this.onClose = () => {
      this.cleanup();
      if (body.readableEnded) resolve();
      else reject(Object.assign(new Error("upstream body closed early"), { code: "UND_ERR_SOCKET" }));
    };
  }

  start(): void {
    const body = this.body;
    body.on("data", this.onData);
    body.once("end", this.onEnd);
    body.once("error", this.onError);
    body.once("close", this.onClose);
  }

  private cleanup(): void {
    const body = this.body;
    body.off("data", this.onData);
    body.off("end", this.onEnd);
    body.off("error", this.onError);
    body.off("close", this.onClose);
  }
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
