/** `http://h:4318` → `http://h:4318/v1/traces` (OTLP/HTTP's traces path); a URL with a path is kept. */
export function otlpTracesUrl(endpoint: string): string {
  const u = new URL(endpoint);
  if (u.pathname === "/" || u.pathname === "") u.pathname = "/v1/traces";
  return u.toString();
}
