import { AtomSimConnector } from "./atom.ts";
import { MooncakeSimConnector } from "./mooncake.ts";
import { MoriioSimConnector } from "./moriio.ts";
import { NixlSimConnector } from "./nixl.ts";
import { SglangSimConnector } from "./sglang.ts";
import type { SimConnector, SimConnectorOptions, SimKvHost } from "./types.ts";

type Make = (opts: SimConnectorOptions, host: SimKvHost) => SimConnector;
const MAKERS: Readonly<Record<Exclude<SimConnectorOptions["kind"], "none">, Make>> = {
  nixl: (o, h) => new NixlSimConnector(o, h),
  mooncake: (o, h) => new MooncakeSimConnector(o, h),
  moriio: (o, h) => new MoriioSimConnector(o, h),
  sglang: (o, h) => new SglangSimConnector(o, h),
  atom: (o, h) => new AtomSimConnector(o, h),
};

/**
 * Creates the connector for `opts.kind`, or null for workers without one. A mixed worker keeps
 * its Nixl connector: vLLM launches both halves with `kv_role: "kv_both"` and each request's
 * `kv_transfer_params` decide whether it acts as P or D, so the sim must do the same.
 */
export function createSimConnector(opts: SimConnectorOptions, host: SimKvHost): SimConnector | null {
  if (opts.kind === "none") return null;
  if (opts.role === "mixed" && opts.kind !== "nixl") return null;
  return MAKERS[opts.kind](opts, host);
}
