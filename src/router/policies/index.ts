/**
 * The former policy registry, kept as a thin view over the pipeline's presets
 * (src/router/pipeline/presets.ts): `policies[name](ctx)` builds that preset's Scheduler for one
 * model. New code uses `buildScheduling` (src/router/pipeline/build.ts).
 */
import { presetNames, presets } from "../pipeline/presets.ts";
import type { PolicyFactory } from "../types.ts";
import { presetPolicy } from "./preset-policy.ts";

export const policies: Record<string, PolicyFactory> = Object.fromEntries(
  Object.keys(presets).map((name) => [name, (ctx) => presetPolicy(name, ctx)]),
);

export function policyNames(): string[] {
  return presetNames();
}
