/** The server's RoutingRequest: prompt text and tokens are computed on first use only. */
import { addsSpecialTokens, type ChatMessageLike, type Tokenizer } from "../kv/tokenizer.ts";
import type { EndpointKind, RoutingRequest } from "../router/types.ts";

export class ServerRoutingRequest implements RoutingRequest {
  private text: string | undefined;
  private tokens: readonly number[] | undefined;

  constructor(
    readonly requestId: string,
    readonly model: string,
    readonly endpoint: EndpointKind,
    readonly body: Readonly<Record<string, unknown>>,
    readonly stream: boolean,
    readonly cacheSalt: string | undefined,
    private readonly tokenizer: Tokenizer,
  ) {}

  promptText(): string {
    if (this.text === undefined) {
      if (this.endpoint === "chat") {
        this.text = this.tokenizer.applyChatTemplate(this.body.messages as ChatMessageLike[]);
      } else {
        const p = firstPrompt(this.body.prompt);
        this.text = typeof p === "string" ? p : this.tokenizer.decode(p);
      }
    }
    return this.text;
  }

  promptTokens(): readonly number[] {
    if (this.tokens === undefined) {
      const p = this.endpoint === "completion" ? firstPrompt(this.body.prompt) : undefined;
      this.tokens =
        p !== undefined && typeof p !== "string"
          ? p
          : this.tokenizer.encode(this.promptText(), addsSpecialTokens(this.endpoint, this.body));
    }
    return this.tokens;
  }
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
