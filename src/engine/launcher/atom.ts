/**
 * ATOM: `python -m atom.entrypoints.openai_server --model M [-tp N] [--kv_cache_dtype fp8]
 * [--block-size 16] --server-port P [--kv-transfer-config '{"kv_role":…,"kv_connector":
 * "moriio"|"mooncake","handshake_port":6301}']`, KV events through ATOM_KV_EVENTS_* only
 * (engine-protocols.md §1, §3, §4e). ATOM's `--port` is an internal engine port, so the
 * HTTP port is `--server-port`. Events carry no sequence frame (framing "atom"), no replay.
 */
import type { ConnectorInfo, KvEventsInfo } from "../../discovery/types.ts";
import { BadRequestError } from "../../protocol/errors.ts";
import { advertisedEndpoint, bindEndpoint, kvRole, opt, rdmaEnv, requireBackend } from "./common.ts";
import type { EngineAdapter, LaunchSpec, TransferBackend } from "./types.ts";

const ATOM_BACKENDS: readonly TransferBackend[] = ["moriio", "mooncake"];

export function atomKvEventsEnv(spec: LaunchSpec): Record<string, string> {
  if (!spec.kvEvents.enabled) return {};
  return {
    ATOM_KV_EVENTS_ENABLE: "1",
    ATOM_KV_EVENTS_PUBLISHER: "zmq",
    ATOM_KV_EVENTS_ENDPOINT: bindEndpoint(spec.host, spec.kvEvents.port),
    ATOM_KV_EVENTS_TOPIC: spec.kvEvents.topic,
  };
}

export const atomAdapter: EngineAdapter = {
  kind: "atom",
  defaultBin: () => ["python", "-m", "atom.entrypoints.openai_server"],
  backends: ATOM_BACKENDS,
  defaultPdBackend: "moriio",
  defaultBlockSize: 16,
  validate(spec) {
    requireBackend(spec, ATOM_BACKENDS);
    if (spec.role === "mixed" && spec.backend !== "none") {
      throw new BadRequestError("atom: a connector needs --role prefill or decode", "connector");
    }
    // ATOM reads these from the checkpoint / its own flags; silently dropping them would mislead.
    if (spec.quantization !== undefined) {
      throw new BadRequestError(
        "atom: --quantization is taken from the checkpoint; pass ATOM's own flag after -- if needed",
        "quantization",
      );
    }
    if (spec.dp !== undefined && spec.dp > 1) {
      throw new BadRequestError(
        "atom: --dp is not mapped to an ATOM flag; pass ATOM's own flag after --",
        "dp",
      );
    }
  },
  build(spec) {
    const argv = [...(spec.engineBin ?? this.defaultBin()), "--model", spec.model];
    opt(argv, "-tp", spec.tp);
    opt(argv, "--kv_cache_dtype", spec.kvCacheDtype);
    opt(argv, "--block-size", spec.blockSize);
    argv.push("--server-port", String(spec.port));
    if (spec.role !== "mixed") {
      const cfg = {
        kv_role: kvRole(spec.role),
        kv_connector: spec.backend,
        handshake_port: spec.handshakePort,
      };
      argv.push("--kv-transfer-config", JSON.stringify(cfg));
    }
    argv.push(...spec.extraArgs);
    return { argv, env: { ...atomKvEventsEnv(spec), ...rdmaEnv(spec) } };
  },
  connector(spec): ConnectorInfo {
    if (spec.role === "mixed") return { kind: "none" };
    return { kind: "atom", bootstrapHost: spec.advertiseHost, handshakePort: spec.handshakePort };
  },
  kvEvents(spec): KvEventsInfo | undefined {
    if (!spec.kvEvents.enabled) return undefined;
    return {
      endpoint: advertisedEndpoint(spec, spec.kvEvents.port),
      topic: spec.kvEvents.topic,
      framing: "atom",
    };
  },
};
