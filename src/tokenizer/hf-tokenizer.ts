import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Template } from "@huggingface/jinja";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { type ChatMessageLike, messageText, renderChatML, type Tokenizer } from "./tokenizer.ts";

type Json = Record<string, unknown>;

function tokenText(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as Json).content === "string")
    return (v as Json).content as string;
  return null;
}

/** The chat template: `chat_template.jinja` if present, else `tokenizer_config.json`'s (string, or the "default" of a list). */
function findChatTemplate(dir: string, config: Json): string | null {
  const file = join(dir, "chat_template.jinja");
  if (existsSync(file)) return readFileSync(file, "utf8");
  const t = config.chat_template;
  if (typeof t === "string") return t;
  if (Array.isArray(t)) {
    const named = t as { name?: string; template?: string }[];
    const pick = named.find((x) => x.name === "default") ?? named[0];
    if (pick && typeof pick.template === "string") return pick.template;
  }
  return null;
}

class HfDirTokenizer implements Tokenizer {
  readonly id: string;
  readonly eosTokenId: number | null;
  private readonly tok: HfTokenizer;
  private readonly template: Template | null;
  private readonly bos: string;
  private readonly eos: string;

  constructor(dir: string, tokenizerJson: Json, config: Json) {
    this.id = `hf:${dir}`;
    this.tok = new HfTokenizer(tokenizerJson, config);
    const src = findChatTemplate(dir, config);
    this.template = src ? new Template(src) : null;
    this.bos = tokenText(config.bos_token) ?? "";
    this.eos = tokenText(config.eos_token) ?? "";
    this.eosTokenId = this.eos ? (this.tok.token_to_id(this.eos) ?? null) : null;
  }

  /** Special tokens (the post-processor's BOS) only when asked: see `addsSpecialTokens`. */
  encode(text: string, addSpecialTokens = false): number[] {
    return this.tok.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  decode(ids: readonly number[]): string {
    return this.tok.decode(ids as number[], { skip_special_tokens: true });
  }

  applyChatTemplate(messages: readonly ChatMessageLike[]): string {
    if (!this.template) return renderChatML(messages);
    const plain = messages.map((m) => ({ ...m, content: messageText(m.content) }));
    return this.template.render({
      messages: plain,
      add_generation_prompt: true,
      bos_token: this.bos,
      eos_token: this.eos,
    });
  }
}

/** Loads `tokenizer.json` + `tokenizer_config.json` (chat_template) from a HF model directory. */
export async function loadHfTokenizer(dir: string): Promise<Tokenizer> {
  const tjPath = join(dir, "tokenizer.json");
  if (!existsSync(tjPath)) throw new Error(`${dir} has no tokenizer.json`);
  const tokenizerJson = JSON.parse(readFileSync(tjPath, "utf8")) as Json;
  const cfgPath = join(dir, "tokenizer_config.json");
  const config = existsSync(cfgPath) ? (JSON.parse(readFileSync(cfgPath, "utf8")) as Json) : {};
  return new HfDirTokenizer(dir, tokenizerJson, config);
}
