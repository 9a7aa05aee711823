/**
 * The server's RoutingRequest: prompt text and tokens are computed on first use only, and
 * bounded: the whole prompt up to a memory cap, tokenized within a time budget (past it,
 * routing has the head's ids; see ./prompt-tokens.ts). A prompt longer than one tokenizer piece
 * is tokenized by `prepare()` in event-loop slices before routing, reusing the ids of an earlier
 * prompt it starts with (./token-prefix-cache.ts).
 */

import type { IncomingHttpHeaders } from "node:http";
import type { RequestTrace } from "../router/trace.ts";
import type { RouteAdmission, RoutedEndpoint, RoutingRequest } from "../router/types.ts";
import { addsSpecialTokens, type ChatMessageLike, type Tokenizer } from "../tokenizer/tokenizer.ts";
import { longStringHead } from "./body-parser-pool.ts";
import {
  type BoundedTokens,
  BUDGET_MS,
  capText,
  PIECE_CHARS,
  ROUTING_TEXT_CAP,
  ROUTING_TOKEN_CAP,
  tokenizeBounded,
  tokenizeBoundedSync,
} from "./prompt-tokens.ts";
import type { TokenPrefixCache } from "./token-prefix-cache.ts";

/** How much tokenizing a request's prompt may cost (config `promptBudgetMs`, `promptCacheTokens`). */
export interface PromptLimits {
  /** Tokenizing time per request before routing settles for the ids so far. */
  budgetMs: number;
  /** Earlier prompts' ids by text prefix (a conversation's next turn reuses its history's). */
  cache: TokenPrefixCache | null;
  /** Counts for the server's metrics. */
  stats?: PromptStats;
}

/** Prompts tokenized piece by piece, and those scored on their head (the budget ran out). */
export class PromptStats {
  pieced = 0;
  partial = 0;
  note(complete: boolean): void {
    this.pieced++;
    if (!complete) this.partial++;
  }
}

const DEFAULT_LIMITS: PromptLimits = { budgetMs: BUDGET_MS, cache: null };

export class ServerRoutingRequest implements RoutingRequest {
  readonly requestId: string;
  readonly model: string;
  readonly endpoint: RoutedEndpoint;
  readonly body: Readonly<Record<string, unknown>>;
  readonly stream: boolean;
  readonly cacheSalt: string | undefined;
  /** Set by the server when tracing is on; always present in the shape, so the class stays monomorphic. */
  trace: RequestTrace | undefined = undefined;
  /** Set by the admission queue when flow control let the request through. */
  admission?: RouteAdmission;
  private readonly tokenizer: Tokenizer;
  private readonly limits: PromptLimits;
  private text: string | undefined;
  private tokens: readonly number[] | undefined;
  /** False once the tokens are known to be only the prompt's head (a cap or the budget cut them). */
  private whole = true;
  /** The client's headers (set by the proxy), read by `header()`. */
  headers: IncomingHttpHeaders | undefined;

  constructor(
    requestId: string,
    model: string,
    endpoint: RoutedEndpoint,
    body: Readonly<Record<string, unknown>>,
    stream: boolean,
    cacheSalt: string | undefined,
    tokenizer: Tokenizer,
    limits: PromptLimits = DEFAULT_LIMITS,
  ) {
    this.requestId = requestId;
    this.model = model;
    this.endpoint = endpoint;
    this.body = body;
    this.stream = stream;
    this.cacheSalt = cacheSalt;
    this.tokenizer = tokenizer;
    this.limits = limits;
  }

  header(name: string): string | undefined {
    const v = this.headers?.[name];
    return Array.isArray(v) ? v[0] : v;
  }

  /** The templated prompt's head (at most ROUTING_TEXT_CAP characters). */
  promptText(): string {
    if (this.text === undefined) {
      if (this.endpoint === "chat") {
        this.text = capText(this.tokenizer.applyChatTemplate(headMessages(this.body.messages)));
      } else {
        const p = firstPrompt(this.body.prompt);
        this.text =
          typeof p === "string"
            ? capText(promptHead(this.body) ?? p)
            : capText(decodeBounded(this.tokenizer, p, this.limits.budgetMs));
      }
    }
    return this.text;
  }

  /** Token ids of the prompt's head (at most ROUTING_TOKEN_CAP). */
  promptTokens(): readonly number[] {
    if (this.tokens === undefined) {
      const p = this.endpoint === "completion" ? firstPrompt(this.body.prompt) : undefined;
      if (p !== undefined && typeof p !== "string") {
        this.tokens = p.length > ROUTING_TOKEN_CAP ? p.slice(0, ROUTING_TOKEN_CAP) : p;
      } else {
        // A short prompt in one call; a long one (not prepared ahead) piece by piece, budgeted.
        const text = this.promptText();
        const add = addsSpecialTokens(this.endpoint, this.body);
        this.tokens =
          text.length <= PIECE_CHARS
            ? this.tokenizer.encode(text, add)
            : this.counted(
                tokenizeBoundedSync(this.tokenizer, text, add, this.limits.budgetMs, this.cache()),
              );
      }
    }
    return this.tokens;
  }

  /**
   * Tokenizes a prompt longer than one piece in bounded slices, yielding to the event loop in
   * between; null when there is nothing to do ahead (short prompt, token ids, done already).
   */
  prepare(): Promise<void> | null {
    if (this.tokens !== undefined) return null;
    if (this.endpoint === "completion" && typeof firstPrompt(this.body.prompt) !== "string") return null;
    const text = this.promptText();
    if (text.length <= PIECE_CHARS) return null;
    const add = addsSpecialTokens(this.endpoint, this.body);
    return tokenizeBounded(this.tokenizer, text, add, this.limits.budgetMs, this.cache()).then((r) => {
      this.tokens = this.counted(r);
    });
  }

  /**
   * The prefix cache, except for a request with a `cache_salt`: the salt asks the engine to keep
   * its prefix cache apart from other users', so its text is neither reused nor kept here.
   */
  private cache(): TokenPrefixCache | null {
    return this.cacheSalt ? null : this.limits.cache;
  }

  /**
   * The prompt's token count as routing counts it (tokenized now, within routing's caps and
   * budget, if the policy did not need it), or undefined when routing saw only its head.
   */
  wholePromptTokenCount(): number | undefined {
    this.promptTokens();
    if (this.tokens === undefined || !this.whole || this.text === undefined) return undefined;
    // capText and headMessages cut a little below the cap (at a word's edge).
    if (this.text.length >= ROUTING_TEXT_CAP - PIECE_CHARS || this.tokens.length >= ROUTING_TOKEN_CAP)
      return undefined;
    return this.tokens.length;
  }

  private counted(r: BoundedTokens): number[] {
    this.limits.stats?.note(r.complete);
    if (!r.complete) this.whole = false;
    return r.ids;
  }
}

/**
 * The messages as far as routing looks: once the contents pass ROUTING_TEXT_CAP characters,
 * the message that crosses it is cut and the rest dropped, so a huge chat is never templated
 * whole (templates render messages in order, so the head of the output is unchanged).
 */
function headMessages(messages: unknown): ChatMessageLike[] {
  const list = messages as ChatMessageLike[];
  let total = 0;
  for (let i = 0; i < list.length; i++) {
    const m = list[i]!;
    const keep = ROUTING_TEXT_CAP - total;
    total += contentLength(m.content, keep);
    if (total > ROUTING_TEXT_CAP) {
      const head = list.slice(0, i);
      head.push({ ...m, content: contentHead(m, keep) });
      return head;
    }
  }
  return list;
}

type Content = ChatMessageLike["content"];

/**
 * The characters `messageText` would give, without joining the parts; counting stops once past
 * `limit` (parts beyond what routing looks at are not read).
 */
function contentLength(content: Content, limit: number): number {
  if (content == null) return 0;
  if (typeof content === "string") return content.length;
  let n = 0;
  for (const part of content) {
    if (n > limit) break;
    if (part.type === "text" && typeof part.text === "string") n += part.text.length;
  }
  return n;
}

/**
 * The first `keep` characters of a message's text. A long string decoded in slices is a rope:
 * its kept head is cut rather than the rope (a flattening copy), and content parts are walked
 * part by part, each through its own head, so a huge part is never joined whole.
 */
function contentHead(m: ChatMessageLike, keep: number): string {
  const content = m.content;
  if (content == null) return "";
  if (typeof content === "string") return (longStringHead(m, "content") ?? content).slice(0, keep);
  let out = "";
  for (const part of content) {
    if (out.length >= keep) break;
    if (part.type !== "text" || typeof part.text !== "string") continue;
    const text = longStringHead(part, "text") ?? part.text;
    out += text.slice(0, keep - out.length);
  }
  return out;
}

/** The kept head of a long string prompt (or of a batch's first prompt), if it has one. */
function promptHead(body: Readonly<Record<string, unknown>>): string | undefined {
  const p = body.prompt;
  if (typeof p === "string") return longStringHead(body, "prompt");
  return Array.isArray(p) && typeof p[0] === "string" ? longStringHead(p, 0) : undefined;
}

/** Ids decoded per call when a token-id prompt's text is needed (approximate trees). */
const DECODE_CHUNK = 4096;

/**
 * The text of a token-id prompt (up to ROUTING_TOKEN_CAP ids), decoded in chunks within the
 * tokenizing budget: the HF decoder takes ≈ 2.6 ms per 1 000 ids here, so 256 Ki ids in one
 * call held the event loop for ≈ 0.7 s. Past the budget the text is the head's. Chunks start
 * at fixed positions, so the same ids always give the same text (a character split across a
 * chunk edge decodes to replacement characters, the same way every time).
 */
function decodeBounded(tok: Tokenizer, ids: readonly number[], budgetMs: number): string {
  const n = Math.min(ids.length, ROUTING_TOKEN_CAP);
  if (n <= DECODE_CHUNK) return tok.decode(ids.length > n ? ids.slice(0, n) : ids);
  const t0 = performance.now();
  let out = "";
  for (let at = 0; at < n; at += DECODE_CHUNK) {
    out += tok.decode(ids.slice(at, Math.min(n, at + DECODE_CHUNK)));
    if (performance.now() - t0 > budgetMs) break;
  }
  return out;
}

/** A completions `prompt` may be a batch; routing looks at its first element. */
function firstPrompt(prompt: unknown): string | readonly number[] {
  if (typeof prompt === "string") return prompt;
  if (Array.isArray(prompt) && prompt.length > 0) {
    const head = prompt[0];
    if (typeof head === "number") return prompt as number[];
    if (typeof head === "string" || Array.isArray(head)) return head as string | number[];
  }
  return "";
}
