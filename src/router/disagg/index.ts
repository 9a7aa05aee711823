/**
 * Prefill/decode disaggregation for the server's AutoRouter: `createDisaggRouter` is the
 * `DisaggRouterFactory` it takes. Options come from the factory defaults, overridden by the
 * server config's `disagg` section (`prefillTimeoutMs`, `decodeTimeoutMs`, `pdFallbackMixed`,
 * `maxPrefillAttempts`), which the AutoRouter passes as `ctx.disagg`.
 */
import type { DisaggRouterFactory } from "../types.ts";
import { type DisaggOptions, DisaggRouter, disaggOptionsFrom } from "./router.ts";

export { pdProtocols, protocolFor, protocolForPair } from "./protocols/index.ts";
export { type DisaggOptions, DisaggRouter } from "./router.ts";

export function makeDisaggRouterFactory(defaults: DisaggOptions = {}): DisaggRouterFactory {
  return (ctx) => new DisaggRouter(ctx, disaggOptionsFrom(ctx.disagg ?? {}, defaults));
}

export const createDisaggRouter: DisaggRouterFactory = makeDisaggRouterFactory();
