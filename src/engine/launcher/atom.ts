/**
 * ATOM: `python -m atom.entrypoints.openai_server --model M [--served-model-name N]
 * [--tensor-parallel-size N] [--data-parallel-size N] [--kv_cache_dtype bf16|fp8]
 * [--block-size 16] [--max-model-len N] --host H --server-port P [--kv-transfer-config
 * '{"kv_role":…,"kv_connector":"moriio"|"mooncake","handshake_port":6301,"http_port":P}']`,
 * KV events through ATOM_KV_EVENTS_* only (docs/engine-protocols.md#launch, #kv-events-enable,
 * #pd-atom; flag spellings from ATOM's atom/model_engine/arg_utils.py and
 * atom/entrypoints/openai/api_server.py).
 * ATOM's `--port` is an internal engine port, so the HTTP port is `--server-port`. Events
 * carry no sequence frame (framing "atom"), no replay.
 */
import type { ConnectorInfo, KvEventsInfo } from "../../discovery/types.ts";
import { BadRequestError } from "../../protocol/errors.ts";
import { advertisedEndpoint, bindEndpoint, dpSize, kvRole, opt, rdmaEnv, requireBackend } from "./common.ts";
import type { EngineAdapter, LaunchSpec, TransferBackend } from "./types.ts";

const ATOM_BACKENDS: readonly TransferBackend[] = ["moriio", "mooncake"];

/** ATOM's `--kv_cache_dtype` choices are bf16 and fp8; vLLM-style spellings map onto them. */
const ATOM_KV_DTYPES: Record<string, "bf16" | "fp8" | undefined> = {
  auto: undefined,
  bf16: "bf16",
  bfloat16: "bf16",
  fp8: "fp8",
  fp8_e4m3: "fp8",
};

export function atomKvCacheDtype(dtype: string | undefined): "bf16" | "fp8" | undefined {
  if (dtype === undefined) return undefined;
  const key = dtype.toLowerCase();
  if (!(key in ATOM_KV_DTYPES)) {
    throw new BadRequestError(
      `atom: --kv-cache-dtype '${dtype}' is not supported (ATOM takes bf16 or fp8)`,
      "kv-cache-dtype",
    );
  }
  return ATOM_KV_DTYPES[key];
}

export function atomKvEventsEnv(spec: LaunchSpec): Record<string, string> {
  if (!spec.kvEvents.enabled) return {};
  return {
    ATOM_KV_EVENTS_ENABLE: "1",
    ATOM_KV_EVENTS_PUBLISHER: "zmq",
    // ATOM always bind()s this endpoint.
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
    // ATOM reads the quantization from the checkpoint; silently dropping the flag would mislead.
    if (spec.quantization !== undefined) {
      throw new BadRequestError(
        "atom: --quantization is taken from the checkpoint; pass ATOM's own flag after -- if needed",
        "quantization",
      );
    }
    atomKvCacheDtype(spec.kvCacheDtype);
    // ATOM answers 400 to any model name but its one served name.
    if (spec.servedModelNames.length > 1) {
      throw new BadRequestError("atom: --served-model-name takes one name", "served-model-name");
    }
    // Every DP rank's scheduler binds the same ATOM_KV_EVENTS_ENDPOINT (no per-rank offset).
    if (spec.kvEvents.enabled && dpSize(spec) > 1) {
      throw new BadRequestError(
        "atom: with --dp > 1 every DP rank binds the same ATOM_KV_EVENTS_ENDPOINT; pass --no-kv-events",
        "dp",
      );
    }
  },
  build(spec) {
    const argv = [...(spec.engineBin ?? this.defaultBin()), "--model", spec.model];
    opt(argv, "--served-model-name", spec.servedModelNames[0]);
    opt(argv, "--tensor-parallel-size", spec.tp);
    opt(argv, "--data-parallel-size", spec.dp);
    opt(argv, "--kv_cache_dtype", atomKvCacheDtype(spec.kvCacheDtype));
    opt(argv, "--block-size", spec.blockSize);
    opt(argv, "--max-model-len", spec.maxModelLen);
    argv.push("--host", spec.host, "--server-port", String(spec.port));
    if (spec.role !== "mixed") {
      const cfg = {
        kv_role: kvRole(spec.role),
        kv_connector: spec.backend,
        handshake_port: spec.handshakePort,
        // Both ATOM connectors default http_port to 8000 and advertise it to the peer.
        http_port: spec.port,
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
