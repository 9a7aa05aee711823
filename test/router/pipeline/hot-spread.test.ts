/**
 * hot-spread: a prefix carrying more than its share of recent decisions avoids the workers whose
 * routed share is above ratio × the mean; ordinary prefixes are never filtered.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { filters } from "../../../src/router/pipeline/registry.ts";
import type { ModelScope, StepContext } from "../../../src/router/pipeline/types.ts";
import type { RoutingRequest, WorkerState } from "../../../src/router/types.ts";
import { createLogger } from "../../../src/util/log.ts";
import { makeWorker } from "./recorder.ts";

const logger = createLogger("test");
logger.level = "silent";
const scope: ModelScope = {
  model: "m",
  logger,
  shared: <T>(_k: string, make: () => T): T => make(),
  onClose: () => {},
  reportBridge: () => {},
};

const tenant = (t: number) => `Tenant ${t} system prompt. `.repeat(60);
function req(t: number, i: number): RoutingRequest {
  const text = `${tenant(t)} question ${i}`;
  return {
    requestId: `t${t}-${i}`,
    model: "m",
    endpoint: "completion",
    body: {},
    stream: false,
    promptText: () => text,
    promptTokens: () => [1, 2, 3],
  };
}
const ctxFor = (r: RoutingRequest, all: WorkerState[]) => ({ req: r, all }) as unknown as StepContext;

test("hot-spread filters only hot prefixes, and only the workers above ratio × the mean share", () => {
  const f = filters.get("hot-spread")!.build(scope, { window: 64, ratio: 1.25 });
  const all = Array.from({ length: 4 }, (_, i) => makeWorker({ id: `w${i}` }));
  const at = [0, 1, 2, 3];
  // History: tenant t always on worker t, uniform.
  for (let i = 0; i < 64; i++) f.onRouted!(req(i % 4, i), all[i % 4]);
  for (let t = 0; t < 4; t++)
    assert.deepEqual(f.filter(ctxFor(req(t, 99), all), at), at, `tenant ${t} is not hot: nothing filtered`);
  // Tenant 0 turns hot, all of it on w0.
  for (let i = 0; i < 12; i++) f.onRouted!(req(0, 100 + i), all[0]);
  assert.deepEqual(
    f.filter(ctxFor(req(0, 200), all), at),
    [1, 2, 3],
    "hot tenant avoids the worker above the ceiling",
  );
  assert.deepEqual(f.filter(ctxFor(req(1, 200), all), at), at, "an ordinary tenant keeps its worker");
  // Spread the hot tenant over w0..w3: shares even out and nothing is filtered any more.
  for (let i = 0; i < 200; i++) f.onRouted!(req(0, 300 + i), all[i % 4]);
  assert.deepEqual(f.filter(ctxFor(req(0, 600), all), at), at);
});

test("hot-spread waits for a quarter window of history", () => {
  const f = filters.get("hot-spread")!.build(scope, { window: 256 });
  const all = [makeWorker({ id: "a" }), makeWorker({ id: "b" })];
  for (let i = 0; i < 40; i++) f.onRouted!(req(0, i), all[0]);
  assert.deepEqual(f.filter(ctxFor(req(0, 99), all), [0, 1]), [0, 1]);
  for (let i = 0; i < 40; i++) f.onRouted!(req(0, 100 + i), all[0]);
  assert.deepEqual(f.filter(ctxFor(req(0, 199), all), [0, 1]), [1]);
});

// Every prompt starts with the same platform preamble (longer than any fixed key), then a
// tenant's system prompt, then the conversation's own history (bench/fleet-routing generate.ts,
// chat traffic). A fixed 1,024-character key made every request hot and pushed conversations
// off the worker holding their history.
const preamble = "Platform preamble shared by every tenant. ".repeat(60);
function chat(t: number, conv: number, turn: number): RoutingRequest {
  let text = `${preamble}${tenant(t)}`;
  for (let k = 0; k <= turn; k++)
    text += `Conversation ${conv} turn ${k}: ${"words of this turn ".repeat(40)}`;
  return {
    requestId: `c${conv}-${turn}`,
    model: "m",
    endpoint: "completion",
    body: {},
    stream: false,
    promptText: () => text,
    promptTokens: () => [1, 2, 3],
  };
}

test("hot-spread: a preamble shared by all traffic makes no request hot, a hot tenant behind it still is", () => {
  const f = filters.get("hot-spread")!.build(scope, { window: 64, ratio: 1.25 });
  const all = Array.from({ length: 4 }, (_, i) => makeWorker({ id: `w${i}` }));
  const at = [0, 1, 2, 3];
  // 32 conversations of 4 tenants, each conversation on one worker; w0 carries most turns.
  for (let turn = 0; turn < 3; turn++)
    for (let conv = 0; conv < 32; conv++)
      f.onRouted!(chat(conv % 4, conv, turn), all[conv < 16 ? 0 : conv % 4]);
  // w0's routed share is far above the mean, yet a conversation's next turn keeps its worker.
  for (const conv of [0, 5, 17, 30])
    assert.deepEqual(
      f.filter(ctxFor(chat(conv % 4, conv, 3), all), at),
      at,
      `conversation ${conv} is not hot`,
    );
  // A tenant behind the same preamble that takes most of the traffic is hot and spills.
  const hot = { ...req(9, 99), promptText: () => `${preamble}${tenant(9)} question 99` };
  for (let i = 0; i < 48; i++)
    f.onRouted!({ ...req(9, 200 + i), promptText: () => `${preamble}${tenant(9)} q ${i}` }, all[0]);
  assert.deepEqual(f.filter(ctxFor(hot, all), at), [1, 2, 3], "the hot tenant avoids w0");
  // A brand-new prompt that shares only the preamble (carried by all traffic) is judged by it.
  const fresh = { ...req(0, 0), promptText: () => `${preamble}something never seen before` };
  assert.deepEqual(f.filter(ctxFor(fresh, all), at), [1, 2, 3]);
});
