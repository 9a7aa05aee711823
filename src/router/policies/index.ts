import type { PolicyFactory } from "../types.ts";
import { createRoundRobin } from "./round-robin.ts";

/** Policy registry: one line per policy; each policy lives in its own file beside this one. */
export const policies: Record<string, PolicyFactory> = {
  "round-robin": createRoundRobin,
};

export function policyNames(): string[] {
  return Object.keys(policies);
}
