/**
 * A preset's Scheduler for one model, built the way the server builds it (buildScheduling), for
 * tests that drive a preset directly over a WorkerSet or a KvIndex.
 */
import type { PrefixIndex } from "../../../src/kv/prefix-index.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import type { Scheduler } from "../../../src/router/pipeline/scheduler.ts";
import type { Logger } from "../../../src/util/log.ts";

export function presetScheduler(
  name: string,
  o: { logger: Logger; options?: Readonly<Record<string, unknown>>; kvIndex?: PrefixIndex },
): Scheduler {
  return buildScheduling({ policy: name, policyOptions: o.options ?? {} }).create({
    model: "",
    logger: o.logger,
    kvIndex: o.kvIndex,
  });
}
