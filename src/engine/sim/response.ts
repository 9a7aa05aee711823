import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { FinishReason } from "./output.ts";
import type { SeqSink, Sequence } from "./sequence.ts";

/**
 * Turns the sequences of one request into the OpenAI answer: SSE chunks as tokens arrive
 * (one write per token per choice, strings built by hand on this hot path), or one JSON
 * body when all choices finished.
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
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
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

  constructor(
    private readonly res: ServerResponse,
    private readonly meta: ResponseMeta,
  ) {
    const id = meta.kind === "chat" ? `chatcmpl-${meta.requestId}` : `cmpl-${meta.requestId}`;
    const object = meta.kind === "chat" ? "chat.completion.chunk" : "text_completion";
    this.head = `data: {"id":${JSON.stringify(id)},"object":"${object}","created":${meta.created},"model":${JSON.stringify(meta.model)},"choices":[{"index":`;
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
    this.remaining++;
  }

  /** Stream start: headers and, for chat, the role chunk of every choice. */
  begin(): void {
    if (!this.meta.stream) return;
    this.res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "x-request-id": this.meta.requestId,
    });
    if (this.meta.kind === "chat") {
      let out = "";
      for (const s of this.seqs) {
        out += `${this.head}${s.index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`;
      }
      this.res.write(out);
    }
    this.res.flushHeaders();
    const sock = this.res.socket;
    const chunked = (this.res as unknown as { chunkedEncoding?: boolean }).chunkedEncoding === true;
    const queued = (this.res as unknown as { outputData?: unknown[] }).outputData;
    if (sock && chunked && (!queued || queued.length === 0)) this.direct = sock;
  }

  /**
   * One SSE event per write. Once the headers are out on a chunked HTTP/1.1 response, the
   * chunk is framed here and written to the socket in one call: Node's own res.write costs
   * four buffered sends, a cork and a tick per chunk, which dominated the sim's CPU at 64
   * streams. res.end() still writes the last chunk and the terminator.
   */
  private writeChunk(text: string): void {
    const sock = this.direct;
    if (sock && !sock.destroyed) sock.write(`${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`);
    else this.res.write(text);
  }

  private direct: Socket | null = null;

  onToken(seq: Sequence): void {
    if (!this.meta.stream || this.ended) return;
    let json = seq.output.takeLastJson();
    if (json === null) {
      const delta = seq.output.takeDelta(false);
      if (delta.length === 0) return;
      json = JSON.stringify(delta);
    }
    this.writeChunk(`${this.head}${seq.index}${this.mid}${json}${this.tail}`);
  }

  onFinish(seq: Sequence, reason: FinishReason): void {
    if (this.ended) return;
    if (reason === "abort") return;
    if (this.meta.stream) {
      const rest = seq.output.takeDelta(true);
      const close = this.meta.kind === "chat" ? "}" : "";
      this.writeChunk(
        `${this.head}${seq.index}${this.mid}${JSON.stringify(rest)}${close},"logprobs":null,"finish_reason":"${reason}","stop_reason":null}]}\n\n`,
      );
    }
    if (--this.remaining === 0) void this.complete();
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
      this.res.end(out);
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
