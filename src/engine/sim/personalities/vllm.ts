/**
 * vLLM (`vllm serve [MODEL]`): flags from vllm/engine/arg_utils.py + entrypoints/openai/cli_args.py
 * (engine-flags.ts); metric names from vllm/v1/metrics/loggers.py (metric-names.ts); KV events
 * from vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34.
 */
import { zmqBindsFor } from "../config.ts";
import { VLLM_FLAGS } from "../engine-flags.ts";
import { METRIC_NAMES } from "../metric-names.ts";
import { vllmToolCallId } from "../request-plan.ts";
import { messagesRoute, responsesRoute } from "./native-apis.ts";
import { noModelCheck, openAiErrorAnswer } from "./openai-errors.ts";
import type { Personality } from "./types.ts";

export const vllm: Personality = {
  kind: "vllm",
  prog: "vllm serve",
  flags: VLLM_FLAGS,
  underscoreFlags: true,
  positionalModel: true,
  defaultPort: 8000,
  defaultHost: "0.0.0.0",
  defaultBlockSize: 16,
  apiKeyEnv: "VLLM_API_KEY",
  // `map` is vLLM's newest layout (events and the batch as maps; KVCacheEvent is no longer
  // array_like) and the default when `--engine vllm` is named; without `--engine` (the sim's
  // long-standing command line) the default stays the older positional `array` layout.
  defaultKvEncoding: (explicit) => (explicit ? "map" : "array"),
  defaultKvFraming: "seq",
  applyArgs: () => {},
  metricNames: METRIC_NAMES.vllm,
  rankLabels: (o) => ({ model_name: o.modelName, engine: String(o.dpRank) }),
  kvLayout: (encoding) => (encoding === "map" ? "vllm-map" : "vllm-array"),
  // offset_endpoint_port: each DP rank's endpoints move up by the rank.
  kvRankPortOffset: (rank) => rank,
  // ZmqEventPublisher._socket_setup binds only for `*`, `::`, ipc://, inproc://.
  kvPubMode: (endpoint) => (zmqBindsFor(endpoint, false) ? "bind" : "connect"),
  // vllm/entrypoints/openai/serving_engine.py _get_data_parallel_rank: header X-data-parallel-rank.
  pinnedRankRaw: (header) => header,
  checkModelName: noModelCheck,
  errorAnswer: openAiErrorAnswer,
  healthBody: null,
  getRoutes: () => ({}),
  postRoutes: { "/v1/responses": responsesRoute, "/v1/messages": messagesRoute },
  requests: {
    tools: true,
    // vllm/entrypoints/openai/chat_completion/serving.py @ 5e918640d7b65820db5beaa98c2a99925bff7c17
    // render_chat_request: without a tool parser, "auto" needs --enable-auto-tool-choice (and the
    // parser), "required" / named need --tool-call-parser.
    toolChoiceRefusal: (c, cfg) => {
      if (c.kind === "none" || cfg.toolCallParser) return null;
      if (c.kind === "auto")
        return cfg.enableAutoToolChoice
          ? null
          : '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set';
      return `tool_choice="${c.kind === "named" ? c.repr : c.kind}" requires --tool-call-parser to be set`;
    },
    autoToolCalls: (cfg) => cfg.enableAutoToolChoice === true && cfg.toolCallParser !== undefined,
    newToolCallId: vllmToolCallId,
    structured: { responseFormat: true, vllmFields: true, sglangFields: false },
    // vllm/sampling_params.py @ 00388f6573ccfcffad607b8c9ecdf341a4669ceb _verify_args / _verify_greedy_sampling.
    // That file also refuses temperature > 2; test/server/hardening.test.ts pins "served" from
    // protocol.py @ 002032ee (no bound), so the sim keeps accepting it until that is settled.
    temperature: { negative: "temperature must be non-negative", max: null, greedyNeedsN1: true },
    // vllm/v1/engine/input_processor.py @ 009daaeebfb0ce2813f970f2173ea9c8eee09092 passes `priority`
    // on unchecked (v0's "Got priority N but Priority scheduling is not enabled." is gone); only
    // the priority request queue (--scheduling-policy priority) orders by it.
    priority: (_p, cfg) => cfg.schedulingPolicy === "priority",
  },
};
