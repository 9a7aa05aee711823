/**
 * SGLang (`python -m sglang.launch_server`): flags from python/sglang/srt/server_args.py @
 * 001067fffe33427bee0ed2f007fb7551a1d76b44 (engine-flags.ts); metrics from
 * observability/metrics_collector.py (metric-names.ts); KV events from
 * python/sglang/srt/disaggregation/kv_events.py @ 612d579090db24ec7c47cc5ca6b83e0c649b8c28.
 */
import { ArgParseError, type RawArgs } from "../arg-types.ts";
import { type SimConfig, zmqBindsFor } from "../config.ts";
import { SGLANG_FLAGS } from "../engine-flags.ts";
import { METRIC_NAMES } from "../metric-names.ts";
import { sglangToolCallId } from "../request-plan.ts";
import { responsesRoute } from "./native-apis.ts";
import { noModelCheck, openAiErrorAnswer } from "./openai-errors.ts";
import { handleGenerate } from "./sglang-generate.ts";
import type { Personality } from "./types.ts";

/**
 * `--disaggregation-mode prefill|decode` is the role, and the SGLang bootstrap protocol
 * (pd/sglang.ts) is the connector whatever `--disaggregation-transfer-backend` names; the
 * bootstrap port (SGLang's default 8998) goes into the transfer config the connector reads.
 * server_args.py: disaggregation_mode choices ["null", "prefill", "decode"],
 * disaggregation_bootstrap_port = 8998.
 */
function applyArgs(cfg: SimConfig, raw: RawArgs): void {
  const mode = raw.values.get("disaggregation-mode") ?? "null";
  if (mode !== "null" && mode !== "prefill" && mode !== "decode") {
    throw new ArgParseError(
      `argument --disaggregation-mode: invalid choice: '${mode}' (choose from 'null', 'prefill', 'decode')`,
      raw.prog,
    );
  }
  const maxTotal = raw.values.get("max-total-tokens");
  if (maxTotal !== undefined && !raw.values.has("num-gpu-blocks")) {
    cfg.numGpuBlocks = Math.max(1, Math.floor(Number(maxTotal) / cfg.blockSize));
  } else if (!raw.values.has("num-gpu-blocks")) {
    // The profile's pool is in 16-token blocks; keep its token capacity at SGLang's page size.
    cfg.numGpuBlocks = Math.max(1, Math.floor((cfg.numGpuBlocks * 16) / cfg.blockSize));
  }
  if (mode === "null") return;
  if (!raw.values.has("role")) cfg.role = mode;
  if (!raw.values.has("connector")) cfg.connector = "sglang";
  const port = Number(raw.values.get("disaggregation-bootstrap-port") ?? 8998);
  cfg.kvTransferConfig = {
    kv_connector: "sglang",
    kv_role: mode === "prefill" ? "kv_producer" : "kv_consumer",
    bootstrap_port: port,
    transfer_backend: raw.values.get("disaggregation-transfer-backend") ?? "mooncake",
    ...(raw.values.has("disaggregation-ib-device")
      ? { ib_device: raw.values.get("disaggregation-ib-device") }
      : {}),
    ...cfg.kvTransferConfig,
  };
}

function getRoutes(cfg: SimConfig): Record<string, () => unknown> {
  const serverInfo = () => ({
    model_path: cfg.model,
    served_model_name: cfg.servedModelNames[0],
    tp_size: cfg.tpSize,
    dp_size: cfg.dpSize,
    page_size: cfg.blockSize,
    context_length: cfg.maxModelLen,
    max_running_requests: cfg.maxNumSeqs,
    chunked_prefill_size: cfg.maxNumBatchedTokens,
    disaggregation_mode: cfg.role === "mixed" ? "null" : cfg.role,
    disaggregation_bootstrap_port: cfg.kvTransferConfig.bootstrap_port ?? 8998,
    host: cfg.host,
    port: cfg.port,
    version: "0.0.0-infera-sim",
  });
  const modelInfo = () => ({
    model_path: cfg.model,
    tokenizer_path: cfg.tokenizerDir ?? cfg.model,
    is_generation: true,
    preferred_sampling_params: null,
    weight_version: "default",
    has_image_understanding: false,
    has_audio_understanding: false,
  });
  return {
    "/get_server_info": serverInfo,
    "/server_info": serverInfo,
    "/get_model_info": modelInfo,
    "/model_info": modelInfo,
  };
}

export const sglang: Personality = {
  kind: "sglang",
  prog: "launch_server.py",
  flags: SGLANG_FLAGS,
  underscoreFlags: false,
  positionalModel: false,
  defaultPort: 30000,
  defaultHost: "127.0.0.1",
  defaultBlockSize: 1,
  defaultKvEncoding: () => "array",
  defaultKvFraming: "seq",
  applyArgs,
  metricNames: METRIC_NAMES.sglang,
  rankLabels: (o) => {
    const l: Record<string, string> = {
      model_name: o.modelName,
      engine_type: o.role === "mixed" ? "unified" : o.role,
      tp_rank: "0",
      pp_rank: "0",
      moe_ep_rank: "0",
    };
    if (o.dpSize > 1) l.dp_rank = String(o.dpRank);
    return l;
  },
  kvLayout: () => "sglang",
  kvRankPortOffset: (rank) => rank,
  // kv_events.py _socket_setup: binds also for 0.0.0.0.
  kvPubMode: (endpoint) => (zmqBindsFor(endpoint, true) ? "bind" : "connect"),
  // serving_base.py extract_routed_dp_rank_from_header: header X-Data-Parallel-Rank over body
  // routed_dp_rank (deprecated data_parallel_rank).
  pinnedRankRaw: (header, body) => header ?? body.routed_dp_rank ?? body.data_parallel_rank,
  checkModelName: noModelCheck,
  errorAnswer: openAiErrorAnswer,
  healthBody: null,
  getRoutes,
  postRoutes: { "/generate": handleGenerate, "/v1/responses": responsesRoute },
  requests: {
    tools: true,
    // python/sglang/srt/entrypoints/openai/serving_chat.py @ 002897c23becbd522d88b8115a763a21765f978a
    // _process_messages: nothing is refused for want of --tool-call-parser. Without it, "auto"
    // only puts the tools in the prompt (plain text back) and "required" / named fall back to a
    // generic JSON-schema constraint; with it, the parser finds the calls.
    toolChoiceRefusal: () => null,
    autoToolCalls: (cfg) => cfg.toolCallParser !== undefined,
    newToolCallId: sglangToolCallId,
    structured: { responseFormat: true, vllmFields: false, sglangFields: true },
    // python/sglang/srt/sampling/sampling_params.py @ 00c17cafcb9e289d5ca97c50e44ada54e4fd5b03
    // verify(): no upper bound; below 1e-5 is greedy (top_k 1).
    temperature: {
      negative: "temperature must be a non-negative finite number",
      max: null,
      greedyNeedsN1: false,
    },
    // Accepted, not modelled (SGLang needs --enable-priority-scheduling to honour it).
    priority: () => false,
  },
};
