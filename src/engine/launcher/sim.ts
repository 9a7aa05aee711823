/**
 * The simulated engine: `node bin/infera-sim.js serve MODEL ...` with vLLM's command line,
 * plus the sim's own `--role` / `--connector` (vLLM's Nixl config says `kv_both`, so the
 * role is not in it). The sim also speaks the SGLang bootstrap and ATOM relay protocols;
 * for those the launcher passes `--connector sglang|atom` and the ports in the transfer config.
 */
import { fileURLToPath } from "node:url";
import type { ConnectorInfo } from "../../discovery/types.ts";
import { kvRole, rdmaEnv, requireBackend } from "./common.ts";
import type { EngineAdapter, LaunchSpec, TransferBackend } from "./types.ts";
import { seqKvEvents, vllmArgs, vllmConnector } from "./vllm.ts";

const SIM_BACKENDS: readonly TransferBackend[] = ["nixl", "mooncake", "moriio", "sglang", "atom"];

export const SIM_BIN = fileURLToPath(new URL("../../../bin/infera-sim.js", import.meta.url));

function simTransferConfig(spec: LaunchSpec): Record<string, unknown> | null {
  if (spec.backend === "sglang") {
    return { kv_connector: "sglang", kv_role: kvRole(spec.role), bootstrap_port: spec.bootstrapPort };
  }
  if (spec.backend === "atom") {
    return { kv_connector: "atom", kv_role: kvRole(spec.role), handshake_port: spec.handshakePort };
  }
  return null;
}

export const simAdapter: EngineAdapter = {
  kind: "sim",
  defaultBin: () => [process.execPath, SIM_BIN],
  backends: SIM_BACKENDS,
  defaultPdBackend: "nixl",
  defaultBlockSize: 16,
  validate: (spec) => requireBackend(spec, SIM_BACKENDS),
  build(spec) {
    const own = simTransferConfig(spec);
    // vLLM's builder covers nixl/mooncake/moriio; sglang/atom get the sim's own config.
    const base = vllmArgs({ ...spec, backend: own ? "none" : spec.backend, extraArgs: [] });
    const argv = [...(spec.engineBin ?? this.defaultBin()), ...base.argv];
    if (own) argv.push("--kv-transfer-config", JSON.stringify(own));
    if (spec.role !== "mixed" || spec.backend !== "none")
      argv.push("--role", spec.role, "--connector", spec.backend);
    argv.push(...spec.extraArgs);
    return { argv, env: { ...base.env, ...rdmaEnv(spec) } };
  },
  connector(spec): ConnectorInfo {
    if (spec.backend === "sglang") {
      return { kind: "sglang", bootstrapHost: spec.advertiseHost, bootstrapPort: spec.bootstrapPort };
    }
    if (spec.backend === "atom") {
      return { kind: "atom", bootstrapHost: spec.advertiseHost, handshakePort: spec.handshakePort };
    }
    return vllmConnector(spec);
  },
  kvEvents: seqKvEvents,
};
