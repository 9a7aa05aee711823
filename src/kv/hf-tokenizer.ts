import type { Tokenizer } from "./tokenizer.ts";

/** Loads `tokenizer.json` + `tokenizer_config.json` (chat_template) from a HF model directory. */
export async function loadHfTokenizer(dir: string): Promise<Tokenizer> {
  throw new Error(`HF tokenizer directories are not supported yet (${dir})`);
}
