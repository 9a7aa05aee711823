import assert from "node:assert/strict";
import { describe, it } from "node:test";

describe("ServerRoutingRequest", () => {
  it("prompt tokens: templated chat, completion strings and token arrays, computed once", async () => {
    const { ServerRoutingRequest } = await import("../../src/server/routing-request.ts");
    const { getDefaultTokenizer } = await import("../../src/tokenizer/tokenizer.ts");
    const tok = getDefaultTokenizer();
    const messages = [
      { role: "system", content: "You are terse." },
      {
        role: "user",
        content: [
          { type: "text", text: "Hi " },
          { type: "text", text: "there" },
        ],
      },
    ];
    const chat = new ServerRoutingRequest("r", "m", "chat", { messages }, false, undefined, tok);
    assert.deepEqual(chat.promptTokens(), tok.encode(tok.applyChatTemplate(messages)));
    assert.equal(chat.promptTokens(), chat.promptTokens(), "memoised");
    assert.match(chat.promptText(), /Hi there/);
    const str = new ServerRoutingRequest("r", "m", "completion", { prompt: "Once upon" }, false, "salt", tok);
    assert.deepEqual(str.promptTokens(), tok.encode("Once upon"));
    assert.equal(str.cacheSalt, "salt");
    const ids = new ServerRoutingRequest(
      "r",
      "m",
      "completion",
      { prompt: [5, 6, 7] },
      false,
      undefined,
      tok,
    );
    assert.deepEqual(ids.promptTokens(), [5, 6, 7]);
    const batch = new ServerRoutingRequest(
      "r",
      "m",
      "completion",
      { prompt: [[1, 2], [3]] },
      false,
      undefined,
      tok,
    );
    assert.deepEqual(batch.promptTokens(), [1, 2]);
  });
});
