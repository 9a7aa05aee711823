import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { chatLogprobs, type LogprobModel, type TokenLogprob } from "./logprobs.ts";
import type { FinishReason } from "./output.ts";
import type { ChoiceShape } from "./request-plan.ts";
import { completionLogprobsWithSampled, outputLogprobs, promptLogprobs } from "./seq-logprobs.ts";
import type { SeqSink, Sequence } from "./sequence.ts";
import { toolDeltas, toolFinishReason, toolMessage } from "./tool-answer.ts";

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
  /** vLLM's stream_options.continuous_usage_stats (with include_usage): usage on every chunk. */
  continuousUsage?: boolean;
  /** Number of prompts (completions batch); choices = prompts x n. */
  numPrompts: number;
  n: number;
  /** Tokens per SSE event (vLLM --stream-interval); 1 = every token. */
  streamInterval: number;
  /** Logprob alternatives per token, or null when the request asked for no logprobs. */
  logprobs: number | null;
  /** `echo`: text put before each choice's text, per prompt (completions: the prompt; chat: a final assistant message). */
  echoTexts: string[] | null;
  /** `echo` with `max_tokens: 0`: the generated token's text is not returned. */
  echoOnly?: boolean;
  /** Needed when `logprobs` or `echo` is set. */
  lpModel: LogprobModel | null;
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
  private readonly res: ServerResponse;
  private readonly meta: ResponseMeta;
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
  /** Per choice, with logprobs: output tokens already reported, and the text offset reached. */
  private lpSent: number[] = [];
  private lpOffset: number[] = [];
  private flushQueued = false;
  private started = false;
  private direct: Socket | null = null;
  /** Per choice: its tool-call layout, if any, and how much of its text became tool deltas. */
  private readonly shapes: (ChoiceShape | null)[] = [];
  private readonly shown: number[] = [];

  constructor(res: ServerResponse, meta: ResponseMeta) {
    this.res = res;
    this.meta = meta;
    const object = meta.kind === "chat" ? "chat.completion.chunk" : "text_completion";
    this.head = `data: {"id":${JSON.stringify(this.id)},"object":"${object}","created":${meta.created},"model":${JSON.stringify(meta.model)},"choices":[{"index":`;
    this.mid = meta.kind === "chat" ? `,"delta":{"content":` : `,"text":`;
    this.tail =
      meta.kind === "chat"
        ? `},"logprobs":null,"finish_reason":null}]`
        : `,"logprobs":null,"finish_reason":null,"stop_reason":null}]`;
  }

  get id(): string {
    return this.meta.kind === "chat" ? `chatcmpl-${this.meta.requestId}` : `cmpl-${this.meta.requestId}`;
  }

  get finished(): boolean {
    return this.ended;
  }

  /** `shape`: the choice answers with tool calls laid out so in its text (tool-answer.ts). */
  addSeq(seq: Sequence, shape: ChoiceShape | null = null): void {
    this.seqs.push(seq);
    this.shapes.push(shape);
    this.shown.push(0);
    this.seqText.push("");
    this.remaining++;
  }

  /** Called once the sequences are submitted. */
  begin(): void {}

  onToken(seq: Sequence): void {
    if (!this.meta.stream || this.ended) return;
    const delta = seq.output.takeDelta(false);
    if (delta.length === 0 || this.meta.echoOnly) return;
    this.seqText[seq.index] += delta;
    this.pendingTokens++;
    this.queueFlush();
  }

  onFinish(seq: Sequence, reason: FinishReason): void {
    if (this.ended || reason === "abort") return;
    if (this.meta.stream) {
      const last = seq.output.takeDelta(true);
      const text = this.meta.echoOnly ? "" : this.seqText[seq.index] + last;
      this.seqText[seq.index] = "";
      this.start();
      this.out += this.event(seq.index, text, reason);
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
        this.out +=
          this.meta.logprobs === null && this.shapes[i] === null
            ? `${this.head}${i}${this.mid}${JSON.stringify(t)}${this.tail}${this.close(i)}`
            : this.event(i, t, null);
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
        this.out += `${this.head}${s.index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]${this.close(s.index, true)}`;
      }
      // vLLM's chat echo: the continued assistant message, as one content chunk per choice.
      if (this.meta.echoTexts) {
        for (const s of this.seqs) {
          this.out += `${this.head}${s.index}${this.mid}${JSON.stringify(this.echoText(s))}},"logprobs":null,"finish_reason":null}]${this.close(s.index, true)}`;
        }
      }
    } else if (this.meta.echoTexts) {
      // vLLM streams the echoed prompt first, as its own chunk per choice.
      for (const s of this.seqs) {
        const lp =
          this.meta.logprobs === null
            ? "null"
            : JSON.stringify(completionLogprobsWithSampled(this.promptLp(s), 0));
        this.out += `${this.head}${s.index}${this.mid}${JSON.stringify(this.echoText(s))},"logprobs":${lp},"finish_reason":null,"stop_reason":null}]${this.close(s.index, true)}`;
      }
    }
  }

  /** One choice's SSE event, with the logprobs of its tokens not yet reported. */
  private event(i: number, text: string, finish: FinishReason | null): string {
    const seq = this.seqs[i];
    let lp = "null";
    if (this.meta.logprobs !== null) {
      const from = this.lpSent[i] ?? 0;
      const entries = this.outputLp(seq, from);
      this.lpSent[i] = from + entries.length;
      const offset = this.lpOffset[i] ?? (this.meta.echoTexts ? this.echoText(seq).length : 0);
      const obj =
        this.meta.kind === "chat" ? chatLogprobs(entries) : completionLogprobsWithSampled(entries, offset);
      let end = offset;
      for (const e of entries) end += e.token.length;
      this.lpOffset[i] = end;
      lp = JSON.stringify(obj);
    }
    const close = this.meta.kind === "chat" ? "}" : "";
    const shape = this.shapes[i];
    const reason = finish === null ? "null" : `"${shape ? toolFinishReason(shape, finish, true) : finish}"`;
    const stopReason =
      finish === null && this.meta.kind === "chat"
        ? ""
        : `,"stop_reason":${JSON.stringify(seq.output.stopReason)}`;
    const delta = shape
      ? this.toolDelta(i, text, finish !== null)
      : `${this.mid}${JSON.stringify(text)}${close}`;
    if (delta === null) return "";
    return `${this.head}${i}${delta},"logprobs":${lp},"finish_reason":${reason}${stopReason}}]${this.close(i)}`;
  }

  /** A tool-shaped choice's delta for its next `text` (null: nothing to send yet, mid-stream). */
  private toolDelta(i: number, text: string, final: boolean): string | null {
    const shape = this.shapes[i] as ChoiceShape;
    const from = this.shown[i];
    this.shown[i] = from + text.length;
    const calls = toolDeltas(shape, i, this.seqs[i].output.text, from, from + text.length);
    if (!calls && !final) return null;
    return `,"delta":${calls ? JSON.stringify({ tool_calls: calls }) : "{}"}`;
  }

  /** The end of a chunk: its usage so far when continuous usage is on (vLLM: per choice). */
  private close(i: number, first = false): string {
    if (!this.meta.continuousUsage) return "}\n\n";
    const s = this.seqs[i];
    const done = first ? 0 : s.numOutputTokens;
    return `,"usage":{"prompt_tokens":${s.numPromptTokens},"total_tokens":${s.numPromptTokens + done},"completion_tokens":${done}}}\n\n`;
  }

  private outputLp(seq: Sequence, from: number): TokenLogprob[] {
    return outputLogprobs(seq, this.meta.lpModel, this.meta.logprobs ?? 0, from);
  }

  private promptLp(seq: Sequence): TokenLogprob[] {
    return promptLogprobs(seq, this.meta.lpModel, this.meta.logprobs ?? 0);
  }

  private echoText(seq: Sequence): string {
    const texts = this.meta.echoTexts;
    return texts ? (texts[Math.floor(seq.index / this.meta.n)] ?? "") : "";
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
        if (this.seqText[i].length > 0) this.out += this.event(i, this.seqText[i], null);
      }
      this.res.end(this.out + out);
      this.out = "";
    } else {
      const wantLp = this.meta.logprobs !== null;
      const choices = this.seqs.map((s) =>
        this.meta.kind === "chat"
          ? {
              index: s.index,
              ...this.chatMessage(s),
              logprobs: wantLp ? chatLogprobs(this.outputLp(s, 0)) : null,
              stop_reason: s.output.stopReason,
            }
          : {
              index: s.index,
              text: this.meta.echoOnly ? this.echoText(s) : this.echoText(s) + s.output.text,
              logprobs: wantLp
                ? completionLogprobsWithSampled(
                    this.meta.echoOnly
                      ? this.promptLp(s)
                      : this.meta.echoTexts
                        ? [...this.promptLp(s), ...this.outputLp(s, 0)]
                        : this.outputLp(s, 0),
                    0,
                  )
                : null,
              finish_reason: s.finishReason,
              stop_reason: s.output.stopReason,
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

  /** A whole chat choice's message and finish_reason (tool calls in vLLM's shape, tool-answer.ts). */
  private chatMessage(s: Sequence): { message: Record<string, unknown>; finish_reason: string | null } {
    const shape = this.shapes[s.index];
    const finish = s.finishReason ?? "stop";
    const calls = shape ? toolMessage(shape, s.output.text, finish) : null;
    if (shape && calls)
      return {
        // vLLM: "" for named / required; auto: the parser's content, the text before the call (none).
        message: {
          role: "assistant",
          content: shape.kind === "parsed" ? null : "",
          refusal: null,
          tool_calls: calls,
        },
        finish_reason: toolFinishReason(shape, finish, false),
      };
    return {
      message: {
        role: "assistant",
        content: this.echoText(s) + s.output.text,
        refusal: null,
        tool_calls: [],
      },
      finish_reason: s.finishReason,
    };
  }

  /** The client went away: nothing more is written. */
  markGone(): void {
    this.ended = true;
  }
}
