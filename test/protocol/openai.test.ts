import assert from "node:assert/strict";
import { describe, it } from "node:test";

describe("request validation fast path", () => {
  it("accepts exactly what the zod schema accepts (randomised bodies)", async () => {
    const { parseChatRequest, parseCompletionRequest, chatCompletionRequestSchema, completionRequestSchema } =
      await import("../../src/protocol/openai.ts");
    const values: unknown[] = [
      undefined,
      null,
      true,
      false,
      0,
      1,
      2,
      -1,
      0.5,
      3,
      2.5,
      "",
      "x",
      [],
      ["a"],
      [1, 2],
      [[1]],
      {},
      { include_usage: true },
      { include_usage: "y" },
      [1.5],
      21,
    ];
    const messages: unknown[] = [
      [{ role: "user", content: "hi" }],
      [{ role: "user", content: null, name: "n" }],
      [{ role: "user", content: [{ type: "text", text: "a" }] }],
      [{ role: "user", content: 5 }],
      [{ role: 1, content: "x" }],
      [{ role: "user", name: null }],
      [],
      "x",
      [null],
    ];
    const fields = [
      "stream",
      "stream_options",
      "max_tokens",
      "n",
      "temperature",
      "top_p",
      "presence_penalty",
      "seed",
      "stop",
      "user",
      "cache_salt",
      "kv_transfer_params",
      "max_completion_tokens",
      "echo",
      "logprobs",
      "top_logprobs",
    ];
    let seed = 12345;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed % n;
    };
    const accepts = (f: (b: unknown) => unknown, b: unknown) => {
      try {
        f(b);
        return true;
      } catch {
        return false;
      }
    };
    let accepted = 0;
    for (let i = 0; i < 3000; i++) {
      const b: Record<string, unknown> = { model: rnd(10) === 0 ? values[rnd(values.length)] : "m" };
      for (let k = rnd(3); k < 3; k++) {
        const f = fields[rnd(fields.length)]!;
        const v = values[rnd(values.length)];
        if (v !== undefined) b[f] = v;
      }
      const chat = { ...b, messages: messages[rnd(messages.length)] };
      const comp = { ...b, prompt: [values[rnd(values.length)], "p", [1, 2, 3], ["a", "b"]][rnd(4)] };
      const zc = chatCompletionRequestSchema.safeParse(chat).success;
      assert.equal(accepts(parseChatRequest, chat), zc, JSON.stringify(chat));
      assert.equal(
        accepts(parseCompletionRequest, comp),
        completionRequestSchema.safeParse(comp).success,
        JSON.stringify(comp),
      );
      if (zc) accepted++;
    }
    assert.ok(accepted > 50, `enough valid bodies were generated (${accepted})`);
  });
});
