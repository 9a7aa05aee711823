import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { ServerRoutingRequest } from "../../src/server/routing-request.ts";
import { loadTokenizer } from "../../src/tokenizer/tokenizer.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";

/** GPT-2's byte-to-unicode table, to build a small byte-level BPE tokenizer.json by hand. */
function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const out: string[] = new Array(256);
  bs.forEach((b, i) => {
    out[b] = String.fromCodePoint(cs[i]);
  });
  return out;
}

/** Llama 3's post-processor: a BOS before every single sequence (when special tokens are added). */
const BOS_POST_PROCESSOR = {
  type: "TemplateProcessing",
  single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
  pair: [
    { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
    { Sequence: { id: "A", type_id: 0 } },
    { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } },
    { Sequence: { id: "B", type_id: 1 } },
  ],
  special_tokens: {
    "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [300], tokens: ["<|begin_of_text|>"] },
  },
};

function writeModelDir(postProcessor: object | null = null): string {
  const dir = mkdtempSync(join(tmpdir(), "infera-hf-tok-"));
  const table = bytesToUnicode();
  const vocab: Record<string, number> = {};
  table.forEach((ch, i) => {
    vocab[ch] = i;
  });
  const merges = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at", "Ġ s", "a y"];
  let next = 256;
  for (const m of merges) vocab[m.replace(" ", "")] = next++;
  const special = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
  const added = special.map((content, i) => ({
    id: 300 + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  for (const a of added) vocab[a.content] = a.id;
  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: postProcessor,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      fuse_unk: false,
      byte_fallback: false,
      vocab,
      merges,
    },
  };
  const chatTemplate =
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}" +
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson));
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({ bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>", chat_template: chatTemplate }),
  );
  return dir;
}

describe("HF tokenizer directory (--tokenizer DIR)", () => {
  let dir: string;
  let sim: SimProcess;

  before(async () => {
    dir = writeModelDir();
    sim = await startSim({ args: ["--speed", "50", "--tokenizer", dir] });
  });
  after(async () => {
    await sim?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("encodes with merges and special tokens, decodes back, renders the chat template", async () => {
    const tok = await loadTokenizer(dir);
    const ids = tok.encode("the cat say");
    // "the" (no leading space) stays bytes; " cat" and " say"... " cat" is one merged token.
    assert.ok(ids.includes(256 + 5), `merged " cat" in ${ids}`);
    assert.equal(tok.decode(ids), "the cat say");
    assert.equal(tok.eosTokenId, 303);
    const prompt = tok.applyChatTemplate([{ role: "user", content: "the cat" }]);
    assert.equal(
      prompt,
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nthe cat<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    );
    const pids = tok.encode(prompt);
    assert.equal(pids[0], 300, "special token text maps to its id");
  });

  it("the sim counts prompt tokens with the directory's tokenizer and template", async () => {
    const tok = await loadTokenizer(dir);
    const client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
    const messages = [{ role: "user" as const, content: "the cat say the cat" }];
    const r = await client.chat.completions.create({ model: sim.model, messages, max_tokens: 5 });
    assert.equal(r.usage?.prompt_tokens, tok.encode(tok.applyChatTemplate(messages)).length);
    assert.equal(r.usage?.completion_tokens, 5);
    assert.ok((r.choices[0].message.content ?? "").length > 0);
  });
});

describe("HF tokenizer with a BOS post-processor (Llama 3 style)", () => {
  let dir: string;
  let sim: SimProcess;

  before(async () => {
    dir = writeModelDir(BOS_POST_PROCESSOR);
    sim = await startSim({ args: ["--speed", "50", "--tokenizer", dir] });
  });
  after(async () => {
    await sim?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const tokenize = async (body: object): Promise<number[]> => {
    const res = await fetch(`${sim.url}/tokenize`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: sim.model, ...body }),
    });
    assert.equal(res.status, 200);
    return ((await res.json()) as { tokens: number[] }).tokens;
  };

  it("completions get the BOS (as vLLM adds special tokens there), chat does not get a second one", async () => {
    const tok = await loadTokenizer(dir);
    const plain = tok.encode("the cat say");
    assert.notEqual(plain[0], 300);
    assert.deepEqual(tok.encode("the cat say", true), [300, ...plain]);

    const client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "none", maxRetries: 0 });
    const c = await client.completions.create({ model: sim.model, prompt: "the cat say", max_tokens: 2 });
    assert.equal(c.usage?.prompt_tokens, plain.length + 1);
    const noBos = await client.completions.create({
      model: sim.model,
      prompt: "the cat say",
      max_tokens: 2,
      // vLLM's extra field: the client's choice wins over the endpoint's default
      ...({ add_special_tokens: false } as object),
    });
    assert.equal(noBos.usage?.prompt_tokens, plain.length);

    const messages = [{ role: "user" as const, content: "the cat" }];
    const chatIds = await tokenize({ messages });
    assert.equal(chatIds[0], 300);
    assert.notEqual(chatIds[1], 300, "the template's BOS only, not a second one");
    const r = await client.chat.completions.create({ model: sim.model, messages, max_tokens: 2 });
    assert.equal(r.usage?.prompt_tokens, chatIds.length);
  });

  it("the router's prompt tokens equal the engine's, so their block hashes agree", async () => {
    const tok = await loadTokenizer(dir);
    const cases: Array<["chat" | "completion", Record<string, unknown>]> = [
      ["completion", { prompt: "the cat say the cat" }],
      ["completion", { prompt: "the cat say the cat", add_special_tokens: false }],
      ["chat", { messages: [{ role: "user", content: "the cat say" }] }],
      ["chat", { messages: [{ role: "user", content: "the cat say" }], add_special_tokens: true }],
    ];
    for (const [kind, body] of cases) {
      const routed = new ServerRoutingRequest(
        "r",
        sim.model,
        kind,
        body,
        false,
        undefined,
        tok,
      ).promptTokens();
      assert.deepEqual([...routed], await tokenize(body), `${kind} ${JSON.stringify(body)}`);
    }
  });

  it("a non-boolean add_special_tokens is a 400 naming the field", async () => {
    const res = await fetch(`${sim.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: sim.model, prompt: "the cat", add_special_tokens: "yes" }),
    });
    assert.equal(res.status, 400);
    const j = (await res.json()) as { error: { param: string } };
    assert.equal(j.error.param, "add_special_tokens");
  });
});
