/**
 * Where engine i of a fleet listens. A fleet stands for N separate engine processes (or hosts)
 * started with one command line; on one machine they cannot share ports, so engine i moves
 * every fixed port it would bind. The rule is our own convention, modelled on the engines'
 * own offset for data-parallel ranks (vLLM's `offset_endpoint_port`, the connectors'
 * `get_port_offset(dp_rank, tp_rank)`): engine i's ranks take the block of `dpSize` ports
 * after engine i-1's, i.e. base + i × dpSize (+ rank, added later by the engine as before).
 * The HTTP port moves by i (one frontend per engine). Port 0 / `*` (any free port) stays as is.
 */
import type { ConnectorKind } from "../../discovery/types.ts";
import { offsetEndpointPort, type SimConfig } from "./config.ts";

/** A connector's fixed-port setting: its config keys, its env vars, its default (see pd/*). */
interface PortSetting {
  keys: readonly string[];
  env: readonly string[];
  fallback: number;
  /** "rank": moves by i × dpSize (a per-rank listener); "http": moves by i (names the HTTP port). */
  step: "rank" | "http";
  /** Read from `kv_connector_extra_config` only (MoRIIO's required keys). */
  extraOnly?: boolean;
}

/** Every port each sim connector binds or advertises from its config (pd/*.ts `start()`). */
const CONNECTOR_PORTS: Record<ConnectorKind, readonly PortSetting[]> = {
  // pd/nixl.ts: side_channel_port → VLLM_NIXL_SIDE_CHANNEL_PORT → 5600, + dp rank.
  nixl: [{ keys: ["side_channel_port"], env: ["VLLM_NIXL_SIDE_CHANNEL_PORT"], fallback: 5600, step: "rank" }],
  // pd/mooncake.ts: the data side channel (default any port) and the bootstrap server.
  mooncake: [
    { keys: ["side_channel_port"], env: [], fallback: 0, step: "rank" },
    { keys: ["bootstrap_port"], env: ["VLLM_MOONCAKE_BOOTSTRAP_PORT"], fallback: 8998, step: "rank" },
  ],
  // pd/moriio.ts: handshake and notify listeners (+ dp rank); http_port names the engine's own.
  moriio: [
    { keys: ["handshake_port"], env: [], fallback: 6301, step: "rank" },
    { keys: ["notify_port"], env: [], fallback: 61005, step: "rank" },
    { keys: ["http_port"], env: [], fallback: 0, step: "http", extraOnly: true },
  ],
  // pd/sglang.ts: the bootstrap server (its rank's data port is any free port).
  sglang: [
    {
      keys: ["bootstrap_port", "disaggregation_bootstrap_port"],
      env: ["SGLANG_DISAGGREGATION_BOOTSTRAP_PORT"],
      fallback: 8998,
      step: "rank",
    },
  ],
  // pd/atom.ts: handshake_port (+ dp rank).
  atom: [{ keys: ["handshake_port"], env: [], fallback: 6301, step: "rank" }],
  none: [],
};

function asPort(v: unknown): number | undefined {
  if (typeof v === "number" && Number.isInteger(v)) return v;
  if (typeof v === "string" && /^\d+$/.test(v.trim())) return Number(v);
  return undefined;
}

/**
 * Engine i's `--kv-transfer-config`: each of the connector's fixed ports moved to its block.
 * The value is found as the connector finds it (top level, extra config, env, default) and
 * written back where it was found, or at the top level when it came from env or default.
 */
export function fleetKvTransferConfig(
  kind: ConnectorKind,
  kvt: Record<string, unknown>,
  index: number,
  dpSize: number,
  env: NodeJS.ProcessEnv = process.env,
): Record<string, unknown> {
  const settings = CONNECTOR_PORTS[kind];
  if (index === 0 || settings.length === 0) return kvt;
  const out: Record<string, unknown> = { ...kvt };
  const rawExtra = kvt.kv_connector_extra_config;
  const extra: Record<string, unknown> | null =
    rawExtra && typeof rawExtra === "object" && !Array.isArray(rawExtra)
      ? { ...(rawExtra as Record<string, unknown>) }
      : null;
  if (extra) out.kv_connector_extra_config = extra;
  for (const s of settings) {
    const off = s.step === "http" ? index : index * dpSize;
    let done = false;
    for (const k of s.keys) {
      if (!s.extraOnly && asPort(kvt[k]) !== undefined) {
        const v = asPort(kvt[k])!;
        if (v !== 0) out[k] = v + off;
        done = true;
        break;
      }
      if (extra && asPort(extra[k]) !== undefined) {
        const v = asPort(extra[k])!;
        if (v !== 0) extra[k] = v + off;
        done = true;
        break;
      }
    }
    if (done || s.extraOnly) continue;
    const fromEnv = s.env.map((e) => asPort(env[e])).find((v) => v !== undefined);
    const base = fromEnv ?? s.fallback;
    if (base !== 0) out[s.keys[0]] = base + off;
  }
  return out;
}

/** Engine i's config: its HTTP port, KV-event endpoints and PD ports moved to its block. */
export function fleetEngineConfig(base: SimConfig, index: number): SimConfig {
  const block = index * base.dpSize;
  const kvEvents = base.kvEvents
    ? {
        ...base.kvEvents,
        endpoint: offsetEndpointPort(base.kvEvents.endpoint, block),
        replay_endpoint: base.kvEvents.replay_endpoint
          ? offsetEndpointPort(base.kvEvents.replay_endpoint, block)
          : null,
      }
    : null;
  return {
    ...base,
    port: base.port === 0 ? 0 : base.port + index,
    kvEvents,
    kvTransferConfig: fleetKvTransferConfig(base.connector, base.kvTransferConfig, index, base.dpSize),
  };
}
