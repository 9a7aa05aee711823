/**
 * A worker's base URL as undici needs it: `Pool` takes an origin only (a URL with a path
 * throws UND_ERR_INVALID_ARG), so a path is kept apart and put before every request's path.
 * Engines behind a path-rewriting proxy are real (`http://gw/team-a/llama` → vLLM's `/`), and
 * discovery (static and etcd) accepts such URLs, so the request plane serves them rather than
 * refusing them (issue #30 item 5). User info, query and fragment are not part of either.
 */
export interface BaseUrl {
  /** `scheme://host[:port]`, what a Pool connects to. */
  origin: string;
  /** The path before `/v1/...`, without a trailing slash ("" for none). */
  prefix: string;
}

export function splitBaseUrl(url: string): BaseUrl {
  const u = new URL(url);
  return { origin: `${u.protocol}//${u.host}`, prefix: u.pathname.replace(/\/+$/, "") };
}
