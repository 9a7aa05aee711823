import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { FinishReason } from "./output.ts";
import type { SeqSink, Sequence } from "./sequence.ts";

/**
 * Turns the sequences of one request into the OpenAI answer: SSE events as tokens arrive,
 * or one JSON body when all choices finished.
 *
 * Streaming writes are batched per event-loop tick: the tokens a step produced for this
 * request (all its choices, and several steps when the engine is catching up) go out in
 * one socket write, as vLLM's output collector merges outputs a slow consumer has not taken
 * yet. `streamInterval` (vLLM's --stream-interval) holds text back until that many tokens
 * are pending. Headers and the chat role chunk go out with the first token, as in vLLM.
 */
export interface ResponseMeta {
  kind: "chat" | "completion";
  requestId: string;
  model: string;
  created: number;
  stream: boolean;
  includeUsage: boolean;
  /** Number of prompts (completions batch); choices = prompts x n. */
  numPrompts: number;
  n: number;
  /** Tokens per SSE event (vLLM --stream-interval); 1 = every token. */
  streamInterval: number;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

/** Responders with output queued this tick; one nextTick writes them all. */
const dirty: RequestResponder[] = [];

function flushDirty(): void {
  const list = dirty.splice(0);
  for (const r of list) {
    try {
      r.flush();
    } catch {
      // A socket that failed mid-write is closing; its 'close' handler aborts the request.
    }
  }
}

export class RequestResponder implements SeqSink {
  readonly seqs: Sequence[] = [];
  private remaining = 0;
  private readonly head: string;
  private readonly mid: string;
  private readonly tail: string;
  private ended = false;
  /** Extra top-level fields for the final body (e.g. kv_transfer_params), set before completion. */
  extra: Record<string, unknown> = {};
  /** Runs when every choice finished, before the answer is written (PD prefill adds its params). */
  beforeEnd: (() => Promise<void>) | null = null;
  onDone: (() => void) | null = null;

  /** Streaming state: text per choice not yet in an event, events not yet written. */
  private seqText: string[] = [];
  private pendingTokens = 0;
  private out = "";
  private flushQueued = false;
  private started = false;
  private direct: Socket | null = null;

  constructor(
    private readonly res: ServerResponse,
    private readonly meta: ResponseMeta,
  ) {
    const object = meta.kind === "chat" ? "chat.completion.chunk" : "text_completion";
    this.head = `data: {"id":${JSON.stringify(this.id)},"object":"${object}","created":${meta.created},"model":${JSON.stringify(meta.model)},"choices":[{"index":`;
    this.mid = meta.kind === "chat" ? `,"delta":{"content":` : `,"text":`;
    this.tail =
      meta.kind === "chat"
        ? `},"logprobs":null,"finish_reason":null}]}\n\n`
        : `,"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n`;
  }

  get id(): string {
    return this.meta.kind === "chat" ? `chatcmpl-${this.meta.requestId}` : `cmpl-${this.meta.requestId}`;
  }

  get finished(): boolean {
    return this.ended;
  }

  addSeq(seq: Sequence): void {
    this.seqs.push(seq);
    this.seqText.push("");
    this.remaining++;
  }

  /** Called once the sequences are submitted. */
  begin(): void {}

  onToken(seq: Sequence): void {
    if (!this.meta.stream || this.ended) return;
    const delta = seq.output.takeDelta(false);
    if (delta.length === 0) return;
    this.seqText[seq.index] += delta;
    this.pendingTokens++;
    this.queueFlush();
  }

  onFinish(seq: Sequence, reason: FinishReason): void {
    if (this.ended || reason === "abort") return;
    if (this.meta.stream) {
      const text = this.seqText[seq.index] + seq.output.takeDelta(true);
      this.seqText[seq.index] = "";
      const close = this.meta.kind === "chat" ? "}" : "";
      this.start();
      this.out += `${this.head}${seq.index}${this.mid}${JSON.stringify(text)}${close},"logprobs":null,"finish_reason":"${reason}","stop_reason":null}]}\n\n`;
    }
    if (--this.remaining === 0) this.completeSafely();
    else this.queueFlush();
  }

  private queueFlush(): void {
    if (this.flushQueued) return;
    this.flushQueued = true;
    dirty.push(this);
    if (dirty.length === 1) process.nextTick(flushDirty);
  }

  readonly flush = (): void => {
    this.flushQueued = false;
    if (this.ended) return;
    if (this.pendingTokens >= this.meta.streamInterval) {
      this.pendingTokens = 0;
      this.start();
      for (let i = 0; i < this.seqText.length; i++) {
        const t = this.seqText[i];
        if (t.length === 0) continue;
        this.out += `${this.head}${i}${this.mid}${JSON.stringify(t)}${this.tail}`;
        this.seqText[i] = "";
      }
    }
    if (this.out.length === 0) return;
    const text = this.out;
    this.out = "";
    const sock = this.direct;
    // Node's res.write costs four buffered sends, a cork and a tick per chunk; once the
    // headers are out on a chunked HTTP/1.1 response, the chunk is framed here instead.
    if (sock && !sock.destroyed) sock.write(`${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`);
    else {
      this.res.write(text);
      this.useDirectWrites();
    }
  };

  /** First output: the status line and headers, and the chat role chunk of every choice. */
  private start(): void {
    if (this.started) return;
    this.started = true;
    this.res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "x-request-id": this.meta.requestId,
    });
    if (this.meta.kind === "chat") {
      for (const s of this.seqs) {
        this.out += `${this.head}${s.index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`;
      }
    }
  }

  private useDirectWrites(): void {
    const sock = this.res.socket;
    const chunked = (this.res as unknown as { chunkedEncoding?: boolean }).chunkedEncoding === true;
    const queued = (this.res as unknown as { outputData?: unknown[] }).outputData;
    if (sock && chunked && this.res.headersSent && (!queued || queued.length === 0)) this.direct = sock;
  }

  usage(): Usage {
    let prompt = 0;
    let completion = 0;
    let cached = 0;
    for (const s of this.seqs) {
      completion += s.numOutputTokens;
      if (s.index % this.meta.n === 0) {
        prompt += s.numPromptTokens;
        cached += s.numCachedPromptTokens;
      }
    }
    return {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      prompt_tokens_details: { cached_tokens: cached },
    };
  }

  /** No input may crash the process: a failure while answering closes this one response. */
  private completeSafely(): void {
    this.complete().catch(() => {
      this.ended = true;
      this.res.destroy();
    });
  }

  private async complete(): Promise<void> {
    if (this.beforeEnd) {
      try {
        await this.beforeEnd();
      } catch {
        // The answer still goes out; the PD params are simply absent.
      }
    }
    if (this.ended) return;
    this.ended = true;
    const usage = this.usage();
    if (this.meta.stream) {
      let out = "";
      const extra = Object.keys(this.extra).length > 0 ? this.extra : null;
      if (this.meta.includeUsage || extra) {
        const id = this.id;
        const object = this.meta.kind === "chat" ? "chat.completion.chunk" : "text_completion";
        const chunk: Record<string, unknown> = {
          id,
          object,
          created: this.meta.created,
          model: this.meta.model,
          choices: [],
          ...(this.meta.includeUsage ? { usage } : {}),
          ...(extra ?? {}),
        };
        out += `data: ${JSON.stringify(chunk)}\n\n`;
      }
      out += "data: [DONE]\n\n";
      this.start();
      // Pending choice text (other choices still mid-stream when the last one finished).
      for (let i = 0; i < this.seqText.length; i++) {
        if (this.seqText[i].length > 0)
          this.out += `${this.head}${i}${this.mid}${JSON.stringify(this.seqText[i])}${this.tail}`;
      }
      this.res.end(this.out + out);
      this.out = "";
    } else {
      const choices = this.seqs.map((s) =>
        this.meta.kind === "chat"
          ? {
              index: s.index,
              message: { role: "assistant", content: s.output.text, refusal: null, tool_calls: [] },
              logprobs: null,
              finish_reason: s.finishReason,
              stop_reason: null,
            }
          : {
              index: s.index,
              text: s.output.text,
              logprobs: null,
              finish_reason: s.finishReason,
              stop_reason: null,
            },
      );
      const body = {
        id: this.id,
        object: this.meta.kind === "chat" ? "chat.completion" : "text_completion",
        created: this.meta.created,
        model: this.meta.model,
        choices,
        usage,
        ...this.extra,
      };
      const text = JSON.stringify(body);
      this.res.writeHead(200, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(text),
        "x-request-id": this.meta.requestId,
      });
      this.res.end(text);
    }
    this.onDone?.();
  }

  /** The client went away: nothing more is written. */
  markGone(): void {
    this.ended = true;
  }
}
