import type { FinishReason, OutputText } from "./output.ts";

/** Receives a sequence's progress; the API layer turns it into JSON or SSE. */
export interface SeqSink {
  onToken(seq: Sequence): void;
  onFinish(seq: Sequence, reason: FinishReason): void;
}

export type SeqStatus = "waiting" | "running" | "finished";

export interface SequenceInit {
  /** Engine request id (X-Request-Id or generated); shared by the n choices of one request. */
  requestId: string;
  index: number;
  promptIds: readonly number[];
  /** Output tokens to generate at most (from max_tokens, or the simulated EOS length). */
  maxTokens: number;
  /** Finish reason when maxTokens is reached: "length" for an explicit limit, "stop" for the simulated EOS. */
  limitReason: "length" | "stop";
  salt: string | null;
  output: OutputText;
  sink: SeqSink;
  /** Prefill role: keep the blocks allocated when the sequence finishes. */
  holdOnFinish?: boolean;
  arrivalMs: number;
  /** vLLM's request `priority` under `--scheduling-policy priority`: lower is admitted first. */
  priority?: number;
}

let nextSeqKey = 1;

/** One sequence (one choice of one request) as the scheduler tracks it. */
export class Sequence {
  /** Unique per sequence within the process. */
  readonly key: number;
  readonly requestId: string;
  readonly index: number;
  readonly numPromptTokens: number;
  /** Prompt followed by the output tokens sampled so far. */
  readonly tokens: number[];
  readonly maxTokens: number;
  readonly limitReason: "length" | "stop";
  readonly salt: string | null;
  readonly output: OutputText;
  readonly sink: SeqSink;
  readonly holdOnFinish: boolean;
  readonly arrivalMs: number;
  readonly priority: number;

  status: SeqStatus = "waiting";
  /** Tokens whose KV is in this sequence's blocks. */
  numComputed = 0;
  blockIds: number[] = [];
  /** Chained hashes of the full blocks of `tokens` known so far. */
  blockHashes: bigint[] = [];
  /** Full blocks already registered with the pool's prefix cache. */
  numCachedBlocks = 0;
  /** Prompt tokens found computed at first scheduling (prefix hits + external KV). */
  numCachedPromptTokens = 0;
  /** Of those, tokens that came from a PD transfer. */
  numExternalTokens = 0;
  firstScheduledMs = 0;
  firstTokenMs = 0;
  lastTokenMs = 0;
  numPreemptions = 0;
  finishReason: FinishReason | null = null;

  constructor(init: SequenceInit) {
    this.key = nextSeqKey++;
    this.requestId = init.requestId;
    this.index = init.index;
    this.numPromptTokens = init.promptIds.length;
    this.tokens = init.promptIds.slice();
    this.maxTokens = init.maxTokens;
    this.limitReason = init.limitReason;
    this.salt = init.salt;
    this.output = init.output;
    this.sink = init.sink;
    this.holdOnFinish = init.holdOnFinish ?? false;
    this.arrivalMs = init.arrivalMs;
    this.priority = init.priority ?? 0;
  }

  get numOutputTokens(): number {
    return this.tokens.length - this.numPromptTokens;
  }

  get isFinished(): boolean {
    return this.status === "finished";
  }

  get promptIds(): number[] {
    return this.tokens.slice(0, this.numPromptTokens);
  }
}
