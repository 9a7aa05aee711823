/**
 * `infera server --print-config`: the merged, validated config as YAML, with secrets (API keys,
 * passwords, tokens, nkey seeds, and the password in any URL's userinfo) shown as "***" so the
 * output can be pasted into an issue.
 */
import { stringify } from "yaml";
import { maskUrlUserinfo } from "../util/mask.ts";
import type { ServerConfig } from "./config.ts";

/** Keys whose values are secrets wherever they appear (nats, discovery.options, profiles...). */
const SECRET_KEY = /(password|token|secret|apikeys?|nkeyseed)$/i;

function redact(v: unknown, key = ""): unknown {
  if (v === undefined || v === null) return v;
  if (SECRET_KEY.test(key)) return Array.isArray(v) ? v.map(() => "***") : "***";
  // Credentials inside URLs (`nats://user:pass@…`, etcd endpoints, worker URLs) under any key.
  if (typeof v === "string") return maskUrlUserinfo(v);
  if (Array.isArray(v)) return v.map((x) => redact(x));
  if (typeof v === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (x !== undefined) out[k] = redact(x, k);
    return out;
  }
  return v;
}

/** The config with its secrets replaced by "***". */
export function redactedConfig(config: ServerConfig): Record<string, unknown> {
  return redact(config) as Record<string, unknown>;
}

export function printableConfig(config: ServerConfig): string {
  return stringify(redactedConfig(config));
}
