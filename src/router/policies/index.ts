import type { PolicyFactory } from "../types.ts";
import { createApproxPrefix } from "./approx-prefix.ts";
import { createKvAware } from "./kv-aware.ts";
import { createRoundRobin } from "./round-robin.ts";

/** Policy registry: one line per policy; each policy lives in its own file beside this one. */
export const policies: Record<string, PolicyFactory> = {
  "round-robin": createRoundRobin,
  "kv-aware": createKvAware,
  "approx-prefix": createApproxPrefix,
};

export function policyNames(): string[] {
  return Object.keys(policies);
}
