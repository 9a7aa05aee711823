/**
 * NATS subject names for the request and KV-event planes. Model and worker names come from
 * users and engines (`meta-llama/Llama-3.1-8B`, `host:8000`), so each becomes one NATS-safe
 * token: no '.', '*', '>', whitespace or control characters, never empty.
 */

const UNSAFE = /[.*>\s\u0000-\u001f\u007f]/g;

/** One subject token; unsafe characters become '_'. An empty name becomes "_". */
export function subjectToken(name: string): string {
  const token = name.replace(UNSAFE, "_");
  return token.length === 0 ? "_" : token;
}

/** Where a worker's agent takes requests: `infera.req.<model>.<worker>`. */
export function requestSubject(model: string, workerId: string): string {
  return `infera.req.${subjectToken(model)}.${subjectToken(workerId)}`;
}

/**
 * Where clients send flow-control credit, pings and aborts for streams of the worker whose
 * request subject is given. A suffix of the request subject, so a record's `natsSubject`
 * alone is enough to derive it.
 */
export function controlSubject(reqSubject: string): string {
  return `${reqSubject}.ctl`;
}

/** Where a worker's agent republishes its engine's KV event batches: `infera.kv.<model>.<worker>`. */
export function kvSubject(model: string, workerId: string): string {
  return `infera.kv.${subjectToken(model)}.${subjectToken(workerId)}`;
}

/** Where a subscriber asks the agent to replay buffered KV batches from a sequence number. */
export function kvReplaySubject(kvSubj: string): string {
  return `${kvSubj}.replay`;
}

/** Prefix of the subjects server replicas share routing announcements on (src/router/peers). */
export const ROUTE_SUBJECT_PREFIX = "infera.route";

/**
 * Where replicas share engine load readings (src/router/peers/load-share.ts): under the route
 * prefix (the same subject permissions), four tokens so no model's subject can be it.
 */
export const LOAD_SUBJECT = `${ROUTE_SUBJECT_PREFIX}._.load`;

/** Where replicas announce routing decisions for a model: `infera.route.<model>`. */
export function routeSubject(model: string): string {
  return `${ROUTE_SUBJECT_PREFIX}.${subjectToken(model)}`;
}
