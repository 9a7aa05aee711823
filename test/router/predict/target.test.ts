/** A request's TTFT target (src/router/predict/target.ts): header first, then model, priority, default. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { type TtftTargetConfig, ttftTargetOf } from "../../../src/router/predict/target.ts";
import type { RoutingRequest } from "../../../src/router/types.ts";

function req(
  model: string,
  headers: Record<string, string> = {},
  body: Record<string, unknown> = {},
): RoutingRequest {
  return {
    requestId: "r",
    model,
    endpoint: "chat",
    body,
    stream: true,
    promptText: () => "",
    promptTokens: () => [],
    header: (n) => headers[n],
  };
}

test("header, then model (per priority), then priority, then the default", () => {
  const cfg: TtftTargetConfig = {
    targetMs: 2000,
    byModel: { fast: 300, chat: { targetMs: 1000, byPriority: { high: 200 } } },
    byPriority: { "-1": 500, low: 5000 },
  };
  assert.equal(ttftTargetOf(req("chat", { "x-infera-ttft-target-ms": "750" }), cfg), 750);
  assert.equal(ttftTargetOf(req("chat", { "x-infera-ttft-target-ms": "junk" }), cfg), 1000);
  assert.equal(ttftTargetOf(req("fast"), cfg), 300);
  assert.equal(ttftTargetOf(req("chat", { "x-infera-priority": "High" }), cfg), 200);
  assert.equal(ttftTargetOf(req("other", {}, { priority: -1 }), cfg), 500, "vLLM's priority field");
  assert.equal(ttftTargetOf(req("other", { "x-infera-priority": "low" }), cfg), 5000, "a band name");
  assert.equal(ttftTargetOf(req("other"), cfg), 2000);
  assert.equal(ttftTargetOf(req("other"), { byModel: {}, byPriority: {} }), undefined, "no target");
});
