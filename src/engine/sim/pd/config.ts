/**
 * Reads a connector's settings the way the real engines do: from `--kv-transfer-config`
 * (top level, then `kv_connector_extra_config`), then the engines' environment variables,
 * then their defaults. Port 0 means "any free port" (tests); the bound port is reported by
 * the connector's `describe()`.
 */
import type { SimConnectorOptions } from "./types.ts";

export function extraConfig(opts: SimConnectorOptions): Record<string, unknown> {
  const extra = opts.kvTransferConfig.kv_connector_extra_config;
  return extra && typeof extra === "object" && !Array.isArray(extra)
    ? (extra as Record<string, unknown>)
    : {};
}

function asNumber(v: unknown): number | undefined {
  if (typeof v === "number" && Number.isFinite(v)) return v;
  if (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v))) return Number(v);
  return undefined;
}

/** First numeric value among config keys (top level, then extra config), env vars, else `fallback`. */
export function configNumber(
  opts: SimConnectorOptions,
  keys: readonly string[],
  envNames: readonly string[],
  fallback: number,
): number {
  const extra = extraConfig(opts);
  for (const k of keys) {
    const v = asNumber(opts.kvTransferConfig[k]) ?? asNumber(extra[k]);
    if (v !== undefined) return v;
  }
  for (const e of envNames) {
    const v = asNumber(process.env[e]);
    if (v !== undefined) return v;
  }
  return fallback;
}

export function configString(
  opts: SimConnectorOptions,
  keys: readonly string[],
  envNames: readonly string[],
): string | undefined {
  const extra = extraConfig(opts);
  for (const k of keys) {
    const v = opts.kvTransferConfig[k] ?? extra[k];
    if (typeof v === "string" && v !== "") return v;
  }
  for (const e of envNames) {
    const v = process.env[e];
    if (v) return v;
  }
  return undefined;
}

export function configBool(opts: SimConnectorOptions, keys: readonly string[], envNames: readonly string[]) {
  const extra = extraConfig(opts);
  for (const k of keys) {
    const v = opts.kvTransferConfig[k] ?? extra[k];
    if (typeof v === "boolean") return v;
    if (v === "1" || v === "true") return true;
    if (v === "0" || v === "false") return false;
  }
  for (const e of envNames) {
    const v = process.env[e];
    if (v === "1" || v === "true") return true;
    if (v === "0" || v === "false") return false;
  }
  return undefined;
}

/** Settings every sim connector shares (sim-only knobs, prefixed `sim_` / `INFERA_SIM_`). */
export interface TransferSettings {
  /** Cap on the bytes one pull moves; the real KV size is reported beside it. */
  maxTransferBytes: number;
  /** How long D waits for a pull (connect + P not ready yet + payload). */
  pullTimeoutMs: number;
  /** How long P keeps blocks nobody pulled. */
  holdTimeoutMs: number;
}

export function transferSettings(opts: SimConnectorOptions): TransferSettings {
  return {
    maxTransferBytes: configNumber(
      opts,
      ["sim_max_transfer_bytes"],
      ["INFERA_SIM_KV_MAX_TRANSFER_BYTES"],
      8 * 1024 * 1024,
    ),
    pullTimeoutMs: configNumber(opts, ["sim_pull_timeout_ms"], ["INFERA_SIM_KV_PULL_TIMEOUT_MS"], 30_000),
    holdTimeoutMs: configNumber(
      opts,
      ["sim_hold_timeout_ms"],
      ["INFERA_SIM_KV_HOLD_TIMEOUT_MS"],
      opts.holdTimeoutMs > 0 ? opts.holdTimeoutMs : 60_000,
    ),
  };
}

export function paramString(params: Record<string, unknown>, key: string): string | undefined {
  const v = params[key];
  if (typeof v === "string" && v !== "") return v;
  if (typeof v === "number" || typeof v === "bigint") return String(v);
  return undefined;
}

export function paramNumber(params: Record<string, unknown>, key: string): number | undefined {
  return asNumber(params[key]);
}
