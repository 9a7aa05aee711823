/**
 * SGLang: `python -m sglang.launch_server --model-path M --host H --port P --kv-events-config
 * '{...}' [--disaggregation-mode prefill|decode --disaggregation-transfer-backend
 * mooncake|nixl|mori --disaggregation-bootstrap-port 8998 [--disaggregation-ib-device D]]
 * [--tp-size N] [--dp-size N] [--quantization Q] [--kv-cache-dtype D] --enable-metrics`
 * (engine-protocols.md §2, §3, §4d). The record's connector is the SGLang bootstrap protocol
 * whatever the transfer backend; the backend goes into the `transferBackend` label.
 */
import type { ConnectorInfo } from "../../discovery/types.ts";
import { BadRequestError } from "../../protocol/errors.ts";
import { dpSize, OTLP_HTTP_ENV, opt, rdmaEnv, requireBackend, wildcardEndpoint } from "./common.ts";
import type { EngineAdapter, LaunchSpec, TransferBackend } from "./types.ts";
import { seqKvEvents } from "./vllm.ts";

const SGLANG_BACKENDS: readonly TransferBackend[] = ["mooncake", "nixl", "mori"];

/** SGLang spells fp8 KV caches by their exact format; plain "fp8" means e4m3 as in vLLM. */
export function sglangKvCacheDtype(dtype: string | undefined): string | undefined {
  return dtype === "fp8" ? "fp8_e4m3" : dtype;
}

/** Rank 0's endpoints; SGLang offsets both ports by the attention-DP rank itself. */
export function sglangKvEventsConfig(spec: LaunchSpec): Record<string, unknown> {
  return {
    publisher: "zmq",
    endpoint: wildcardEndpoint(spec.kvEvents.port),
    replay_endpoint: wildcardEndpoint(spec.kvEvents.replayPort),
    topic: spec.kvEvents.topic,
  };
}

/** Whether the extra engine args turn on SGLang's DP attention. */
export function sglangDpAttention(spec: LaunchSpec): boolean {
  return spec.extraArgs.includes("--enable-dp-attention");
}

export const sglangAdapter: EngineAdapter = {
  kind: "sglang",
  defaultBin: () => ["python", "-m", "sglang.launch_server"],
  backends: SGLANG_BACKENDS,
  defaultPdBackend: "mooncake",
  // SGLang's default page size is 1 token.
  defaultBlockSize: 1,
  validate(spec) {
    requireBackend(spec, SGLANG_BACKENDS);
    if (spec.role === "mixed" && spec.backend !== "none") {
      throw new BadRequestError("sglang: a connector needs --role prefill or decode", "connector");
    }
    // --served-model-name is one string in SGLang; a second alias would be advertised but refused.
    if (spec.servedModelNames.length > 1) {
      throw new BadRequestError("sglang: --served-model-name takes one name", "served-model-name");
    }
    // SGLang offsets the KV-event ports by the attention-DP rank, which is 0 on every replica
    // without --enable-dp-attention: plain --dp N replicas would all bind the same port.
    if (spec.kvEvents.enabled && dpSize(spec) > 1 && !sglangDpAttention(spec)) {
      throw new BadRequestError(
        "sglang: with --dp > 1 every replica publishes KV events on the same port unless DP " +
          "attention is on; add '-- --enable-dp-attention' or pass --no-kv-events",
        "dp",
      );
    }
  },
  build(spec) {
    const argv = [...(spec.engineBin ?? this.defaultBin())];
    argv.push("--model-path", spec.model, "--host", spec.host, "--port", String(spec.port));
    // SGLang takes one served name.
    opt(argv, "--served-model-name", spec.servedModelNames[0]);
    if (spec.kvEvents.enabled) argv.push("--kv-events-config", JSON.stringify(sglangKvEventsConfig(spec)));
    if (spec.role !== "mixed") {
      argv.push(
        "--disaggregation-mode",
        spec.role,
        "--disaggregation-transfer-backend",
        spec.backend,
        "--disaggregation-bootstrap-port",
        String(spec.bootstrapPort),
      );
      opt(argv, "--disaggregation-ib-device", spec.ibDevice);
    }
    // Full spellings: `--tp`/`--dp` only work as argparse abbreviations.
    opt(argv, "--tp-size", spec.tp);
    opt(argv, "--dp-size", spec.dp);
    opt(argv, "--quantization", spec.quantization);
    opt(argv, "--kv-cache-dtype", sglangKvCacheDtype(spec.kvCacheDtype));
    opt(argv, "--page-size", spec.blockSize);
    opt(argv, "--context-length", spec.maxModelLen);
    const env = rdmaEnv(spec);
    // SGLang traces with `--enable-trace --otlp-traces-endpoint`; an HTTP endpoint takes
    // OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf and the full /v1/traces URL
    // (sgl-project/sglang docs/references/production_request_trace.md @ 93d04878cfb9b08645fae7b11bd340ee33b34acf).
    if (spec.otlpTracesUrl) {
      argv.push("--enable-trace", "--otlp-traces-endpoint", spec.otlpTracesUrl);
      Object.assign(env, OTLP_HTTP_ENV);
    }
    argv.push("--enable-metrics", ...spec.extraArgs);
    return { argv, env };
  },
  connector(spec): ConnectorInfo {
    if (spec.role === "mixed") return { kind: "none" };
    return { kind: "sglang", bootstrapHost: spec.advertiseHost, bootstrapPort: spec.bootstrapPort };
  },
  kvEvents: seqKvEvents,
};
