/**
 * One way to keep credentials inside URLs out of logs, `--print-config`, the dashboard and the
 * APIs: `scheme://user:pass@host` becomes `scheme://user:***@host` (a bare `scheme://token@host`,
 * as NATS takes a token, becomes `scheme://***@host`). Works on comma-separated lists
 * (`--nats-url a,b`) and on text that is not a URL (returned unchanged). A leaf module.
 */

/** `scheme://` then userinfo (no '/', '@' or whitespace) then '@'. */
const USERINFO = /([a-z][a-z0-9+.-]*:\/\/)([^/@\s,?#]*)@/gi;

/** Masks the password (or a lone token) in every URL of `text`; other text is unchanged. */
export function maskUrlUserinfo(text: string): string;
export function maskUrlUserinfo(text: string | undefined): string | undefined;
export function maskUrlUserinfo(text: string | undefined): string | undefined {
  if (text === undefined || !text.includes("@")) return text;
  return text.replace(USERINFO, (_m, scheme: string, info: string) => {
    const colon = info.indexOf(":");
    return colon < 0 ? `${scheme}***@` : `${scheme}${info.slice(0, colon)}:***@`;
  });
}

/**
 * A URL whose userinfo has a password (`scheme://user:pass@` or `scheme://:pass@`): such a URL
 * must not come on argv, which every user of the host can read (`ps`, /proc/PID/cmdline).
 */
export function urlHasPassword(url: string): boolean {
  try {
    return new URL(url).password !== "";
  } catch {
    // Not a URL the parser takes: judge by the shape alone.
    return /^[a-z][a-z0-9+.-]*:\/\/[^/@\s]*:[^/@\s]+@/i.test(url);
  }
}

/**
 * Masks every string inside a value (arrays, plain objects), for configs, records and log
 * fields. Returns the value itself when nothing needed masking (no copy on the common path).
 */
export function maskUrlsDeep<T>(v: T, depth = 0): T {
  if (typeof v === "string") return maskUrlUserinfo(v) as T;
  if (depth > 8 || v === null || typeof v !== "object") return v;
  if (Array.isArray(v)) {
    let out: unknown[] | undefined;
    v.forEach((x, i) => {
      const m = maskUrlsDeep(x, depth + 1);
      if (m === x) return;
      out ??= [...v];
      out[i] = m;
    });
    return (out ?? v) as T;
  }
  if (Object.getPrototypeOf(v) !== Object.prototype) return v;
  let out: Record<string, unknown> | undefined;
  for (const [k, x] of Object.entries(v)) {
    const m = maskUrlsDeep(x, depth + 1);
    if (m === x) continue;
    out ??= { ...(v as Record<string, unknown>) };
    out[k] = m;
  }
  return (out ?? v) as T;
}
