import type { PolicyFactory } from "../types.ts";

/** Policy registry: one line per policy; each policy lives in its own file beside this one. */
export const policies: Record<string, PolicyFactory> = {};

export function policyNames(): string[] {
  return Object.keys(policies);
}
