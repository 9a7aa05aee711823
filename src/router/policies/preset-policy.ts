/** A preset's Scheduler from a PolicyContext (the former policy factories' signature). */
import { buildScheduling } from "../pipeline/build.ts";
import type { Scheduler } from "../pipeline/scheduler.ts";
import type { PolicyContext } from "../types.ts";

export function presetPolicy(name: string, ctx: PolicyContext): Scheduler {
  return buildScheduling({ policy: name, policyOptions: ctx.options }).create({
    model: "",
    logger: ctx.logger,
    kvIndex: ctx.kvIndex,
  });
}
