/**
 * NATS identities and permissions in Kubernetes (issue #30 item 1). Before, the server and every
 * engine pod shared one user with no subject permissions, so any pod running model code could
 * read every prompt on `infera.req.>`, answer another worker's requests, and forge KV events.
 *
 * Now each role is its own NATS user with its own password:
 * - `server`: publishes requests (`infera.req.>`), KV replay requests and route announcements
 *   (`infera.route.>`); subscribes to its inboxes (`_INBOX.>`, where answers arrive), every KV
 *   subject and `infera.route.>`. The only user that may read answers.
 * - `engine-<model>-<pool>`, one per pool: takes requests only on its own pods' subjects
 *   (`infera.req.<model>.<pod>` and `.ctl`), publishes KV batches only on its own pods' KV
 *   subjects, answers only messages it received (`allow_responses`), and can read nothing else.
 *   The agent and the KV relay are one process (`infera engine`), so they share it.
 * - `route`: the NATS cluster's own routes between replicas.
 *
 * Why per pool and not per pod: a StatefulSet's pods share one template, so a pod cannot be
 * given a Secret of its own; the pool's user lists each pod's subjects (`<pool>-0` … `<pool>-N-1`),
 * so a pod could act for a sibling of its pool (same image, same model), never for another pool,
 * model or the server. Scaling a pool past its rendered `replicas` needs a re-render.
 *
 * Syntax: nats-server's config `authorization { users = [ { user, password, permissions:
 * { publish: { allow }, subscribe: { allow }, allow_responses: { max, expires } } } ] }`
 * (nats-io/nats-server server/opts.go @ 1787eee035cf0253c201fa0f05afad92b6f296dc,
 * parseAllowResponses: `max` < 0 is unlimited, the default is 1 message within 2 minutes,
 * too few for a streamed answer). Passwords
 * are `$VAR` references filled from the Secret through the NATS container's env, so no secret
 * lands in the ConfigMap.
 */

import { createHash } from "node:crypto";
import { kvSubject, requestSubject } from "../../transport/nats/subjects.ts";
import type { ModelSpec, PoolSpec } from "../spec.ts";
import { names, poolName, type RenderContext, workerObjectName } from "./context.ts";

export interface NatsUser {
  user: string;
  /** The config variable (and NATS container env var) holding its password. */
  envVar: string;
  publish: string[];
  subscribe: string[];
  /** May publish to the reply subjects of messages it received (engines). */
  responses: boolean;
}

/** The NATS user of the server pods. */
export const SERVER_NATS_USER = "server";
/** The NATS cluster routes' user. */
export const ROUTE_NATS_USER = "route";

/** The NATS user of a pool's engine pods. */
export const engineNatsUser = (m: ModelSpec, p: PoolSpec): string => `engine-${m.name}-${poolName(p)}`;

const envVarOf = (user: string): string => `NATS_PW_${user.toUpperCase().replace(/[^A-Z0-9]/g, "_")}`;

/**
 * How long an engine may keep answering a request it received. Every flow-control credit and
 * ping the client sends on the stream's control subject carries the same reply inbox, and each
 * delivery of a message with a reply renews it (nats-io/nats-server server/client.go @
 * 1787eee035cf0253c201fa0f05afad92b6f296dc, deliverMsg: `client.replies[reply] = &resp{now, 0}`),
 * so only a stream silent this long loses its answer.
 */
const RESPONSE_EXPIRES = "10m";

function serverUser(): NatsUser {
  return {
    user: SERVER_NATS_USER,
    envVar: envVarOf(SERVER_NATS_USER),
    publish: ["infera.req.>", "infera.kv.*.*.replay", "infera.kv.*.*.*.replay", "infera.route.>"],
    subscribe: ["_INBOX.>", "infera.kv.>", "infera.route.>"],
    responses: false,
  };
}

function engineUser(ctx: RenderContext, m: ModelSpec, p: PoolSpec): NatsUser {
  const user = engineNatsUser(m, p);
  const publish: string[] = [];
  const subscribe: string[] = [];
  const sts = workerObjectName(ctx, m, p);
  for (let i = 0; i < p.replicas; i++) {
    // Worker ids are the pod names (`--worker-id $(POD_NAME)`), model tokens the `--model`.
    const req = requestSubject(m.model, `${sts}-${i}`);
    const kv = kvSubject(m.model, `${sts}-${i}`);
    subscribe.push(req, `${req}.ctl`, `${kv}.replay`, `${kv}.*.replay`);
    // `.*`: data-parallel ranks publish on `<kv>.dp<r>` (kv-wire.ts kvRankSubject).
    publish.push(kv, `${kv}.*`);
  }
  return { user, envVar: envVarOf(user), publish, subscribe, responses: true };
}

/** Every client user of the cluster's NATS: the server, then one per pool. */
export function natsUsers(ctx: RenderContext): NatsUser[] {
  const out = [serverUser()];
  for (const m of ctx.spec.models) for (const p of m.pools) out.push(engineUser(ctx, m, p));
  const seen = new Set<string>();
  for (const u of out) {
    if (seen.has(u.envVar)) throw new Error(`two NATS users map to one variable ${u.envVar}`);
    seen.add(u.envVar);
  }
  return out;
}

const list = (xs: string[]): string => `[${xs.map((x) => JSON.stringify(x)).join(", ")}]`;

/** The `authorization { users = [...] }` block of nats.conf. */
export function natsAuthorizationBlock(ctx: RenderContext): string[] {
  const lines = ["authorization {", "  users = ["];
  for (const u of natsUsers(ctx)) {
    lines.push(
      "    {",
      `      user: ${JSON.stringify(u.user)}`,
      `      password: $${u.envVar}`,
      "      permissions: {",
      `        publish: { allow: ${list(u.publish)} }`,
      `        subscribe: { allow: ${list(u.subscribe)} }`,
      ...(u.responses ? [`        allow_responses: { max: -1, expires: "${RESPONSE_EXPIRES}" }`] : []),
      "      }",
      "    }",
    );
  }
  lines.push("  ]", "}");
  return lines;
}

/** The routes' authorization line inside nats.conf's `cluster` block. */
export const ROUTE_AUTH_LINE = `  authorization { user: ${ROUTE_NATS_USER}, password: $${envVarOf(ROUTE_NATS_USER)} }`;

type EnvVar = { name: string; value?: string; valueFrom?: object };

/** Every key of the credentials Secret: the client users, then the routes' user when clustered. */
function credentialUsers(ctx: RenderContext): string[] {
  return [
    ...natsUsers(ctx).map((u) => u.user),
    ...(ctx.spec.planes.natsReplicas > 1 ? [ROUTE_NATS_USER] : []),
  ];
}

/**
 * The credentials Secret's name. One the user supplies (`auth.natsCredentialsSecret`) or creates
 * by hand is `NAME-nats-credentials`. A generated one also carries a hash of its key set: the
 * operator may only create Secrets (never read or patch them), so a Secret written once could
 * never gain the key of a pool added later (its pods would fail on the missing key). With the
 * key set in the name, a spec that changes the users renders a new, complete Secret (fresh
 * passwords, and every NATS client and nats-server roll onto it with the changed references),
 * while a spec that keeps them keeps the Secret and its passwords.
 */
export function natsSecretName(ctx: RenderContext): string {
  const base = names.natsSecret(ctx);
  if (ctx.spec.auth.natsCredentialsSecret || ctx.secrets !== "generate") return base;
  const keys = credentialUsers(ctx).sort().join("\n");
  return `${base}-${createHash("sha256").update(keys).digest("hex").slice(0, 10)}`;
}

/** The NATS container's env: every user's password from the credentials Secret. */
export function natsServerEnv(ctx: RenderContext): EnvVar[] {
  const secret = natsSecretName(ctx);
  return credentialUsers(ctx).map((user) => ({
    name: envVarOf(user),
    valueFrom: { secretKeyRef: { name: secret, key: user } },
  }));
}

/**
 * A password that nats-server reads back as a string through a `$VAR` reference. It parses the
 * variable's value as a config value (nats-io/nats-server conf/parse.go, lookupVariable: the
 * env value is parsed as `pkey=<value>`), so a hex secret such as `2e51ab…` is lexed as a
 * float and refused ("variable reference … could not be parsed", the server exits 1), and an
 * all-digit one becomes an integer. Checked with Debian's nats-server: `2e51abc0` refused,
 * `s2e51abc0` accepted. A leading letter makes any generated value an unquoted string.
 */
function natsPassword(ctx: RenderContext): string {
  const v = ctx.random();
  return /^[A-Za-z]/.test(v) ? v : `p${v}`;
}

/** The generated credentials: one key per user, its password. */
export function natsCredentials(ctx: RenderContext): Record<string, string> {
  const out: Record<string, string> = {};
  for (const user of credentialUsers(ctx)) out[user] = natsPassword(ctx);
  return out;
}

/**
 * The env a NATS client (the server, a pool's launchers) reads its identity from: the user by
 * name, its password from its own key of the Secret only (a pod never sees another's).
 */
export function natsClientIdentityEnv(ctx: RenderContext, user: string): EnvVar[] {
  return [
    { name: "INFERA_NATS_USER", value: user },
    { name: "INFERA_NATS_PASSWORD", valueFrom: { secretKeyRef: { name: natsSecretName(ctx), key: user } } },
  ];
}
