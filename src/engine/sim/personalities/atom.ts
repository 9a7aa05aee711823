/**
 * ATOM (`python -m atom.entrypoints.openai_server`), all from ROCm/ATOM @
 * ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21: flags atom/model_engine/arg_utils.py +
 * atom/entrypoints/openai/api_server.py; metrics atom/entrypoints/openai/metrics.py; KV events
 * atom/distributed/kv_events.py, atom/utils/envs.py, atom/config.py.
 */
import { InferaError } from "../../../protocol/errors.ts";
import type { RawArgs } from "../arg-types.ts";
import { parseKvEventsConfig, type SimConfig } from "../config.ts";
import { ATOM_FLAGS } from "../engine-flags.ts";
import { METRIC_NAMES } from "../metric-names.ts";
import type { Personality } from "./types.ts";

/**
 * ATOM refuses a model name other than its served name with FastAPI's HTTPException shape:
 * atom/entrypoints/openai/api_server.py validate_model()
 * → 400 {"detail": "Requested model 'X' does not match server model 'Y'"} (trailing "/" ignored).
 * vLLM answers 404 model_not_found (OpenAI shape, openai-request.ts).
 */
export class AtomModelMismatchError extends InferaError {
  constructor(requested: string, served: string) {
    super(400, `Requested model '${requested}' does not match server model '${served}'`);
  }
}

function checkModelName(cfg: SimConfig, body: unknown): void {
  if (body === null || typeof body !== "object") return;
  const model = (body as Record<string, unknown>).model;
  if (typeof model !== "string") return;
  const served = cfg.servedModelNames[0];
  if (model.replace(/\/+$/, "") !== served.replace(/\/+$/, ""))
    throw new AtomModelMismatchError(model, served);
  // Accepted (a trailing "/" aside): the rest of the request path sees the served name.
  (body as Record<string, unknown>).model = served;
}

/**
 * The PD role comes from `--kv-transfer-config` (kv_role), the protocol is ATOM's relay
 * (pd/atom.ts) whatever kv_connector names; KV events are env-only: atom/utils/envs.py
 * ATOM_KV_EVENTS_ENABLE ("1"), _PUBLISHER ("zmq"), _ENDPOINT ("tcp://127.0.0.1:5557"),
 * _TOPIC (""), _HWM (0), _BUFFER_STEPS (10000); atom/config.py KVEventsConfig.from_env.
 */
function applyArgs(cfg: SimConfig, raw: RawArgs, env: NodeJS.ProcessEnv): void {
  const role = cfg.kvTransferConfig.kv_role;
  if (role !== undefined && !raw.values.has("connector")) cfg.connector = "atom";
  if (env.ATOM_KV_EVENTS_ENABLE === "1") {
    cfg.kvEvents = parseKvEventsConfig({
      enable_kv_cache_events: true,
      publisher: env.ATOM_KV_EVENTS_PUBLISHER || "zmq",
      endpoint: env.ATOM_KV_EVENTS_ENDPOINT || "tcp://127.0.0.1:5557",
      topic: env.ATOM_KV_EVENTS_TOPIC ?? "",
      hwm: Number(env.ATOM_KV_EVENTS_HWM || "0"),
      buffer_steps: Number(env.ATOM_KV_EVENTS_BUFFER_STEPS || "10000"),
    });
  }
}

export const atom: Personality = {
  kind: "atom",
  prog: "openai_server.py",
  flags: ATOM_FLAGS,
  underscoreFlags: true,
  positionalModel: false,
  defaultPort: 8000,
  defaultHost: "0.0.0.0",
  defaultBlockSize: 16,
  defaultKvEncoding: () => "array",
  defaultKvFraming: "atom",
  applyArgs,
  metricNames: METRIC_NAMES.atom,
  rankLabels: () => ({}), // unlabelled, summed across DP ranks
  kvLayout: () => "atom",
  // Every rank binds the configured endpoint, so ranks > 1 collide (EADDRINUSE) as on ATOM.
  kvRankPortOffset: () => 0,
  kvPubMode: () => "bind",
  // api_server.py: request.data_parallel_rank (body only).
  pinnedRankRaw: (_header, body) => body.data_parallel_rank,
  checkModelName,
  // The handlers turn a ValueError into HTTPException(400, detail=str(e)) and anything else into
  // HTTPException(500, ...): FastAPI's `{"detail": ...}` body (api_server.py chat_completions).
  errorAnswer: (e) => ({ body: { detail: e.message }, headers: {} }),
  // api_server.py health()
  healthBody: { status: "ok" },
  // api_server.py server_info() / kv_transfer_info()
  getRoutes: (cfg) => ({
    "/server_info": () => ({
      model_id: cfg.servedModelNames[0],
      served_model_name: cfg.servedModelNames[0],
      tp_size: cfg.tpSize,
      dp_size: cfg.dpSize,
    }),
    "/kv_transfer_info": () => ({
      tp_size: cfg.tpSize,
      dp_size: cfg.dpSize,
      kv_role: cfg.kvTransferConfig.kv_role ?? null,
      handshake_port: cfg.kvTransferConfig.handshake_port ?? 6301,
    }),
  }),
  postRoutes: {},
  // Not checked against ATOM's api_server.py yet: tools, tool_choice and response_format are
  // ignored (free text), as the sim always did for ATOM.
  requests: {
    tools: false,
    toolChoiceRefusal: () => null,
    autoToolCalls: () => false,
    newToolCallId: () => "",
    structured: { responseFormat: false, vllmFields: false, sglangFields: false },
    temperature: null,
    priority: () => false,
  },
};
