import type { SimConnector, SimConnectorOptions, SimKvHost } from "./types.ts";

/** Creates the connector for `opts.kind`, or null for mixed workers without one. */
export function createSimConnector(opts: SimConnectorOptions, host: SimKvHost): SimConnector | null {
  void host;
  if (opts.kind === "none" || opts.role === "mixed") return null;
  throw new Error(`PD connector ${opts.kind} is not built yet`);
}
