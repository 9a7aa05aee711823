/**
 * Which of the gateway's extra routes a healthy engine serves, asked once before it registers
 * (the record's `routes`, read by src/server/api/). Each route gets a POST of `{}`: the engines'
 * HTTP servers (FastAPI for vLLM, SGLang and ATOM) answer a path they do not serve with 404
 * (405 for another method's path), and a path they serve with a validation error for the empty
 * body (400/422) or an answer; that a route exists depends on the model and flags (vLLM
 * registers its pooling routes for pooling runners only), which is why it is asked rather than
 * derived from the engine kind. 401/403 (an engine with its own API key) and 5xx (vLLM's 501
 * for an API the model does not support) say nothing, so the route is left out: a route left
 * out is translated or refused by the server, never sent to an engine that may not serve it.
 */
const PROBED = [
  "/v1/responses",
  "/v1/messages",
  "/v1/embeddings",
  "/v1/rerank",
  "/v1/score",
  "/tokenize",
  "/detokenize",
] as const;

const TIMEOUT_MS = 2000;

async function serves(base: string, path: string): Promise<boolean> {
  try {
    const res = await fetch(`${base}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
      signal: AbortSignal.timeout(TIMEOUT_MS),
    });
    await res.body?.cancel();
    const s = res.status;
    return s >= 200 && s < 500 && s !== 401 && s !== 403 && s !== 404 && s !== 405;
  } catch {
    return false;
  }
}

/** The extra routes the engine at `base` serves, in a fixed order. */
export async function probeRoutes(base: string): Promise<string[]> {
  const found = await Promise.all(PROBED.map((p) => serves(base, p)));
  return PROBED.filter((_, i) => found[i]);
}
