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
const scope: ModelScope = { model: "m", logger, shared: <T>(_k: string, make: () => T): T => make() };

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
