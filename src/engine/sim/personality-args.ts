/**
 * Maps each personality's own PD / KV-event settings onto the SimConfig fields the core and
 * the pd/ connectors read (role, connector, kvTransferConfig, kvEvents).
 */
import { ArgParseError, type RawArgs } from "./arg-types.ts";
import { parseKvEventsConfig, type SimConfig } from "./config.ts";

/**
 * SGLang: `--disaggregation-mode prefill|decode` is the role, and the SGLang bootstrap protocol
 * (pd/sglang.ts) is the connector whatever `--disaggregation-transfer-backend` names; the
 * bootstrap port (SGLang's default 8998) goes into the transfer config the connector reads.
 * sglang-project/sglang python/sglang/srt/server_args.py: disaggregation_mode choices
 * ["null", "prefill", "decode"], disaggregation_bootstrap_port = 8998.
 */
function applySglang(cfg: SimConfig, raw: RawArgs): void {
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

/**
 * ATOM: the PD role comes from `--kv-transfer-config` (kv_role), the protocol is ATOM's relay
 * (pd/atom.ts) whatever kv_connector names; KV events are env-only:
 * ROCm/ATOM atom/utils/envs.py ATOM_KV_EVENTS_ENABLE ("1"), _PUBLISHER ("zmq"),
 * _ENDPOINT ("tcp://127.0.0.1:5557"), _TOPIC (""), _HWM (0), _BUFFER_STEPS (10000);
 * atom/config.py KVEventsConfig.from_env.
 */
function applyAtom(cfg: SimConfig, raw: RawArgs, env: NodeJS.ProcessEnv): void {
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

export function applyPersonality(cfg: SimConfig, raw: RawArgs, env: NodeJS.ProcessEnv): void {
  if (cfg.engine === "sglang") applySglang(cfg, raw);
  else if (cfg.engine === "atom") applyAtom(cfg, raw, env);
}
