/** The former policy factories' signature, kept for the frozen pre-pipeline code here. */
import type { PrefixIndex } from "../../../../src/kv/prefix-index.ts";
import type { RoutingPolicy } from "../../../../src/router/types.ts";
import type { Logger } from "../../../../src/util/log.ts";

/** What a policy factory may use. Optional parts exist only when the server has them. */
export interface PolicyContext {
  logger: Logger;
  /** Policy-specific options from flags/config, e.g. `{ overlapWeight: 1, temperature: 0 }`. */
  options: Readonly<Record<string, unknown>>;
  /** The shared KV prefix index, when KV events are ingested. */
  kvIndex?: PrefixIndex;
}

export type PolicyFactory = (ctx: PolicyContext) => RoutingPolicy;
