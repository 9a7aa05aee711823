/**
 * vLLM: `vllm serve MODEL --host H --port P [--served-model-name N...] [...] --kv-events-config
 * '{...}' [--kv-transfer-config '{...}']` (engine-protocols.md §3, §4a–c). The simulated
 * engine takes the same command line, so `sim.ts` reuses this builder.
 */
import type { ConnectorInfo, KvEventsInfo } from "../../discovery/types.ts";
import { BadRequestError } from "../../protocol/errors.ts";
import {
  advertisedEndpoint,
  dpSize,
  kvEventRanks,
  kvRole,
  OTLP_HTTP_ENV,
  opt,
  rdmaEnv,
  requireBackend,
  wildcardEndpoint,
} from "./common.ts";
import type { EngineAdapter, EngineCommand, LaunchSpec, TransferBackend } from "./types.ts";

const VLLM_BACKENDS: readonly TransferBackend[] = ["nixl", "mooncake", "moriio"];

/** Rank 0's endpoints; vLLM offsets both ports by the DP rank itself. */
export function vllmKvEventsConfig(spec: LaunchSpec): Record<string, unknown> {
  return {
    enable_kv_cache_events: true,
    publisher: "zmq",
    endpoint: wildcardEndpoint(spec.kvEvents.port),
    replay_endpoint: wildcardEndpoint(spec.kvEvents.replayPort),
    topic: spec.kvEvents.topic,
  };
}

/**
 * vLLM's MoRIIOConnector reads `proxy_ip`, `proxy_ping_port`, `http_port`, `handshake_port`
 * and `notify_port` from kv_connector_extra_config with no default (a KeyError at start-up
 * otherwise), and only pairs a producer with a consumer: refuse what it cannot run.
 */
export function validateVllmMoriio(spec: LaunchSpec): void {
  if (spec.backend !== "moriio") return;
  if (spec.role === "mixed") {
    throw new BadRequestError(
      `${spec.engine}: MoRIIO has no kv_both role; use --role prefill or --role decode`,
      "role",
    );
  }
  if (!spec.moriioProxy) {
    throw new BadRequestError(
      `${spec.engine}: MoRIIO needs --moriio-proxy HOST[:PORT] (or INFERA_MORIIO_PROXY): the ` +
        "infera server's MoRIIO registration socket (a server started with --discovery " +
        "moriio, port 36367 by default); vLLM reads proxy_ip/proxy_ping_port without defaults",
      "moriio-proxy",
    );
  }
}

/** `--kv-transfer-config` and the environment each vLLM connector reads. */
export function vllmKvTransfer(
  spec: LaunchSpec,
): { config: Record<string, unknown>; env: Record<string, string> } | null {
  switch (spec.backend) {
    case "nixl":
      return {
        config: { kv_connector: "NixlConnector", kv_role: "kv_both" },
        env: {
          VLLM_NIXL_SIDE_CHANNEL_PORT: String(spec.sideChannelPort),
          VLLM_NIXL_SIDE_CHANNEL_HOST: spec.advertiseHost,
        },
      };
    case "mooncake":
      return {
        config: { kv_connector: "MooncakeConnector", kv_role: kvRole(spec.role) },
        env: { VLLM_MOONCAKE_BOOTSTRAP_PORT: String(spec.bootstrapPort) },
      };
    case "moriio": {
      const extra: Record<string, unknown> = {};
      if (spec.moriioProxy) {
        extra.proxy_ip = spec.moriioProxy.host;
        extra.proxy_ping_port = spec.moriioProxy.port;
      }
      Object.assign(extra, {
        http_port: spec.port,
        handshake_port: spec.handshakePort,
        notify_port: spec.notifyPort,
        // The mode lives in the config: VLLM_MORIIO_CONNECTOR_READ_MODE is deprecated and ignored.
        read_mode: spec.moriioMode === "read",
      });
      // MoRIIO otherwise advertises get_ip(), which may not be the routable address.
      if (spec.advertiseHostGiven) extra.host_ip = spec.advertiseHost;
      return {
        config: {
          kv_connector: "MoRIIOConnector",
          kv_role: kvRole(spec.role),
          kv_connector_extra_config: extra,
        },
        env: {},
      };
    }
    default:
      return null;
  }
}

/** Everything after the executable: `serve MODEL ...`. */
export function vllmArgs(spec: LaunchSpec): EngineCommand {
  const argv = ["serve", spec.model, "--host", spec.host, "--port", String(spec.port)];
  if (spec.servedModelNames.length > 0) argv.push("--served-model-name", ...spec.servedModelNames);
  opt(argv, "--tensor-parallel-size", spec.tp);
  opt(argv, "--data-parallel-size", spec.dp);
  opt(argv, "--quantization", spec.quantization);
  opt(argv, "--kv-cache-dtype", spec.kvCacheDtype);
  opt(argv, "--block-size", spec.blockSize);
  opt(argv, "--max-model-len", spec.maxModelLen);
  if (spec.kvEvents.enabled) argv.push("--kv-events-config", JSON.stringify(vllmKvEventsConfig(spec)));
  const env: Record<string, string> = { ...rdmaEnv(spec) };
  const transfer = vllmKvTransfer(spec);
  if (transfer) {
    argv.push("--kv-transfer-config", JSON.stringify(transfer.config));
    Object.assign(env, transfer.env);
  }
  if (spec.otlpTracesUrl) {
    argv.push("--otlp-traces-endpoint", spec.otlpTracesUrl);
    Object.assign(env, OTLP_HTTP_ENV);
  }
  argv.push(...spec.extraArgs);
  return { argv, env };
}

export function vllmConnector(spec: LaunchSpec): ConnectorInfo {
  switch (spec.backend) {
    case "nixl":
      return { kind: "nixl", bootstrapHost: spec.advertiseHost, bootstrapPort: spec.sideChannelPort };
    case "mooncake":
      return { kind: "mooncake", bootstrapHost: spec.advertiseHost, bootstrapPort: spec.bootstrapPort };
    case "moriio":
      return {
        kind: "moriio",
        bootstrapHost: spec.advertiseHost,
        handshakePort: spec.handshakePort,
        notifyPort: spec.notifyPort,
        // What the router's MoRIIO protocol follows: WRITE runs P and D together.
        transferMode: spec.moriioMode === "write" ? "WRITE" : "READ",
      };
    default:
      return { kind: "none" };
  }
}

/** vLLM/SGLang: rank 0 in the top-level fields, every rank in `ranks` when there are several. */
export function seqKvEvents(spec: LaunchSpec): KvEventsInfo | undefined {
  if (!spec.kvEvents.enabled) return undefined;
  const info: KvEventsInfo = {
    endpoint: advertisedEndpoint(spec, spec.kvEvents.port),
    replayEndpoint: advertisedEndpoint(spec, spec.kvEvents.replayPort),
    topic: spec.kvEvents.topic,
    framing: "seq",
  };
  if (dpSize(spec) > 1) info.ranks = kvEventRanks(spec, true);
  return info;
}

export const vllmAdapter: EngineAdapter = {
  kind: "vllm",
  defaultBin: () => ["vllm"],
  backends: VLLM_BACKENDS,
  defaultPdBackend: "nixl",
  defaultBlockSize: 16,
  validate(spec) {
    requireBackend(spec, VLLM_BACKENDS);
    validateVllmMoriio(spec);
  },
  build(spec) {
    const args = vllmArgs(spec);
    return { argv: [...(spec.engineBin ?? this.defaultBin()), ...args.argv], env: args.env };
  },
  connector: vllmConnector,
  kvEvents: seqKvEvents,
};
