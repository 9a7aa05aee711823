/**
 * `infera server` replicas for one policy, spawned through the CLI with static discovery over a
 * workers file (records with `kvEvents`), behind the round-robin HTTP balancer of
 * bench/kv-routing, as a production deployment would have them. Several replicas share their
 * routing state (src/router/peers) over a loopback ZMQ mesh (`--peers`) unless `share` is off;
 * only profiles with the pending bridge (`bridgePending`) announce anything.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { killChild, killOnExit, stopChild } from "../../src/util/child-process.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { startBalancer } from "../kv-routing/balancer.ts";
import { type Engine, fetchText } from "./engines.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
export const MODEL = "sim-model";

/**
 * The composed profiles this benchmark adds to the presets (`round-robin`, `approx-prefix`,
 * `kv-aware`, `kv-aware-classic`; a preset with options is written `kv-aware:ceilingRatio=0`).
 * They replace the mixed step of `kv-aware-classic` (the former kv-aware preset). The first:
 * kv-aware-classic's scorers with the engine's own waiting queue weighted 4× more (16 per waiting request instead of 4), so a
 * worker that has started to queue loses its affinity sooner, in the way llm-d's precise
 * profile weighs its queue scorer against the prefix scorer. Config-file syntax:
 * src/router/pipeline/README.md ("Composing a profile").
 */
export const COMPOSED_NAME = "kv+queue";
const COMPOSED_YAML = `policy: kv-aware-classic
profiles:
  mixed:
    filters:
      - name: imbalance-guard
        params: { balanceAbsThreshold: 16, balanceRelThreshold: 1.5, prefer: overlap }
    scorers:
      - { name: kv-prefix, weight: 1 }
      - { name: prefill-backlog, weight: 1 }
      - { name: active-decode, weight: 0.5 }
      - { name: engine-queue, weight: 16 }
      - { name: cache-pressure, weight: 0.1 }
    picker: { name: argmin }
`;

/**
 * A second composed profile, for the hot-spot case: kv-aware's scorers behind the load-ceiling
 * filter (src/router/pipeline/filters/load-ceiling.ts) instead of SGLang's imbalance guard: a
 * worker loaded above 1.5 × the mean + 2 leaves the choice, so a hot tenant spills to the next
 * worker by prefix score while every other request keeps its locality.
 */
export const SPREAD_NAME = "kv+spread";
const SPREAD_YAML = `policy: kv-aware-classic
profiles:
  mixed:
    filters:
      - name: load-ceiling
        params: { ratio: 1.5, slack: 2 }
    scorers:
      - { name: kv-prefix, weight: 1 }
      - { name: prefill-backlog, weight: 1 }
      - { name: active-decode, weight: 0.5 }
      - { name: engine-queue, weight: 4 }
      - { name: cache-pressure, weight: 0.1 }
    picker: { name: argmin }
`;

/**
 * A third, for bursts of new prefixes: kv-aware's preset with its `recentRoutingMs` bridge on.
 * KV events report a prefix only once the engine has prefilled it; a prompt queued behind a
 * backlog is invisible to the index for as long as it waits, so the same tenant's next requests
 * see no overlap anywhere and kv-aware spreads them by load, each paying a cold prefill (a
 * collapse under overload, bench/fleet-routing/RESULTS.md). The bridge counts a routed prompt as
 * cached on its worker for RECENT_MODEL_S model seconds (the max with the events). The router's
 * clock is wall time: the window is RECENT_MODEL_S / --speed, as for GPUs that much slower.
 */
export const RECENT_NAME = "kv+recent";
const RECENT_MODEL_S = 10;
const RECENT_YAML = (speed: number) => `policy: kv-aware-classic
profiles:
  mixed:
    filters:
      - name: imbalance-guard
        params: { balanceAbsThreshold: 16, balanceRelThreshold: 1.5, prefer: overlap }
    scorers:
      - { name: kv-prefix, weight: 1, params: { recentRoutingMs: ${Math.round((RECENT_MODEL_S * 1000) / speed)} } }
      - { name: prefill-backlog, weight: 1 }
      - { name: active-decode, weight: 0.5 }
      - { name: engine-queue, weight: 4 }
      - { name: cache-pressure, weight: 0.1 }
    picker: { name: argmin }
`;

/**
 * A fourth: the same bridge for exactly as long as the lag lasts (kv-prefix `bridgePending`: a
 * routed prompt counts as cached on its worker until the worker's pending prefill shows it past
 * its first token, plus 1 s of grace), with the prefix weighted 2: a follower that would wait
 * behind its tenant's queued prompt costs that prompt's backlog (prefill-backlog), and with
 * weight 1 it would tie with a cold worker's whole prefill and leave, the copy the bridge is
 * there to avoid. No time window, so nothing depends on --speed.
 */
export const PENDING_NAME = "kv+pending";
const PENDING_YAML = `policy: kv-aware-classic
profiles:
  mixed:
    filters:
      - name: imbalance-guard
        params: { balanceAbsThreshold: 16, balanceRelThreshold: 1.5, prefer: overlap }
    scorers:
      - { name: kv-prefix, weight: 2, params: { bridgePending: true } }
      - { name: prefill-backlog, weight: 1 }
      - { name: active-decode, weight: 0.5 }
      - { name: engine-queue, weight: 4 }
      - { name: cache-pressure, weight: 0.1 }
    picker: { name: argmin }
`;

/**
 * A fifth, for the hot-spot case: kv-aware with the `hot-spread` filter in front
 * (src/router/pipeline/filters/hot-spread.ts): a prefix carrying more than 1/N of the recent
 * decisions may not go to a worker whose routed share is above 1.25 × the mean, so a dominant
 * tenant spills onto more workers (each caching it) while the other tenants keep theirs.
 */
export const HOT_NAME = "kv+hot";
const HOT_YAML = `policy: kv-aware-classic
profiles:
  mixed:
    filters:
      - name: imbalance-guard
        params: { balanceAbsThreshold: 16, balanceRelThreshold: 1.5, prefer: overlap }
      - name: hot-spread
        params: { window: 256, ratio: 1.25 }
    scorers:
      - { name: kv-prefix, weight: 1 }
      - { name: prefill-backlog, weight: 1 }
      - { name: active-decode, weight: 0.5 }
      - { name: engine-queue, weight: 4 }
      - { name: cache-pressure, weight: 0.1 }
    picker: { name: argmin }
`;

/**
 * Issue #29's flow-control variants: today's default `kv-aware` preset with the server's
 * admission queue on (src/router/flow/README.md). `kv-aware+flow` judges headroom by the `load`
 * signal at GIE's defaults (engine queue ≤ 5, KV usage < 0.8); `kv-aware+flow-ttft` by the
 * `predicted-ttft` signal (the server's online predictor, fitted from what it observes, against
 * a target of FLOW_TTFT_TARGET_MODEL_S). A queued request past FLOW_MAX_WAIT_MODEL_S is answered
 * 429: the operator sets the wait below the TTFT SLO, since a request that waited longer would
 * miss it anyway and only delays the ones behind it. The server's clocks are wall time, hence
 * / speed (the sims run the modelled GPU `speed` times as fast as real time).
 * FLEET_ROUTING_FLOW_MAX_WAIT_S and FLEET_ROUTING_FLOW_TTFT_TARGET_S override both (model s).
 * Both run without locality (`flow.locality.waitMs: 0`, the queue as Run I measured it);
 * `kv-aware+flow-local` is `kv-aware+flow` with it (src/router/flow/locality.ts): a queued
 * request waits up to FLOW_LOCALITY_WAIT_MODEL_S (FLEET_ROUTING_FLOW_LOCALITY_WAIT_S) for the
 * worker holding ≥ FLEET_ROUTING_FLOW_LOCALITY_GAIN more of its prompt than any with headroom.
 */
export const FLOW_NAME = "kv-aware+flow";
export const FLOW_TTFT_NAME = "kv-aware+flow-ttft";
export const FLOW_LOCAL_NAME = "kv-aware+flow-local";
/**
 * `load` with a tighter KV-usage bound (issue #29's preemption goal, lane F, bench/flow/RESULTS.md
 * Run 10): a worker past FLEET_ROUTING_FLOW_MAX_KV (default 0.6) of its KV pool takes no new
 * request, so what is running keeps room to grow its context instead of being preempted.
 * `kv-aware+flow-local-kv`: the same with locality, as `kv-aware+flow-local`.
 */
export const FLOW_KV_NAME = "kv-aware+flow-kv";
/**
 * `kv-aware+flow-local` as before Run L: each replica counts its own dispatches since an engine
 * reading once, as if it were alone (`load` `perReplicaGrowth: false`), for side-by-side runs
 * behind several replicas.
 */
export const FLOW_LOCAL_ALONE_NAME = "kv-aware+flow-local-alone";
export const FLOW_LOCAL_KV_NAME = "kv-aware+flow-local-kv";
const FLOW_MAX_KV = Number(process.env.FLEET_ROUTING_FLOW_MAX_KV ?? 0.6);
const FLOW_MAX_WAIT_MODEL_S = Number(process.env.FLEET_ROUTING_FLOW_MAX_WAIT_S ?? 1.5);
const FLOW_TTFT_TARGET_MODEL_S = Number(process.env.FLEET_ROUTING_FLOW_TTFT_TARGET_S ?? 1);
const FLOW_LOCALITY_WAIT_MODEL_S = Number(process.env.FLEET_ROUTING_FLOW_LOCALITY_WAIT_S ?? 0.5);
const FLOW_LOCALITY_GAIN = Number(process.env.FLEET_ROUTING_FLOW_LOCALITY_GAIN ?? 512);
const FLOW_LOCALITY_PICK = process.env.FLEET_ROUTING_FLOW_LOCALITY_PICK ?? "cheapest";
const wallMs = (modelS: number, speed: number) => Math.max(1, Math.round((modelS * 1000) / speed));
const FLOW_YAML = (speed: number, headroom: string, localityModelS = 0) => `policy: kv-aware
flow:
  enabled: true
  maxQueue: 100000
  maxWaitMs: ${wallMs(FLOW_MAX_WAIT_MODEL_S, speed)}
  locality: { waitMs: ${localityModelS > 0 ? wallMs(localityModelS, speed) : 0}, minGainTokens: ${FLOW_LOCALITY_GAIN}, pick: ${FLOW_LOCALITY_PICK} }
  headroom:
    - ${headroom}
`;

/** Composed profiles by bench name: their config file for a run at `speed`. */
const COMPOSED_PROFILES: Readonly<Record<string, (speed: number) => string>> = {
  [COMPOSED_NAME]: () => COMPOSED_YAML,
  [SPREAD_NAME]: () => SPREAD_YAML,
  [RECENT_NAME]: RECENT_YAML,
  [PENDING_NAME]: () => PENDING_YAML,
  // The same without SGLang's imbalance guard, which under overload sends requests to the
  // least-loaded worker whatever its cache (RESULTS.md, Run C).
  [`${PENDING_NAME}-noguard`]: () => PENDING_YAML.replace(/ {4}filters:\n.*\n.*\n/, ""),
  [HOT_NAME]: () => HOT_YAML,
  [FLOW_NAME]: (speed) => FLOW_YAML(speed, "{ name: load }"),
  [FLOW_LOCAL_NAME]: (speed) => FLOW_YAML(speed, "{ name: load }", FLOW_LOCALITY_WAIT_MODEL_S),
  [FLOW_LOCAL_ALONE_NAME]: (speed) =>
    FLOW_YAML(speed, "{ name: load, params: { perReplicaGrowth: false } }", FLOW_LOCALITY_WAIT_MODEL_S),
  [FLOW_KV_NAME]: (speed) => FLOW_YAML(speed, `{ name: load, params: { maxKvUsage: ${FLOW_MAX_KV} } }`),
  [FLOW_LOCAL_KV_NAME]: (speed) =>
    FLOW_YAML(speed, `{ name: load, params: { maxKvUsage: ${FLOW_MAX_KV} } }`, FLOW_LOCALITY_WAIT_MODEL_S),
  // With locality, flow control's default since Run J (Run K).
  [FLOW_TTFT_NAME]: (speed) =>
    FLOW_YAML(
      speed,
      `{ name: predicted-ttft, params: { targetMs: ${wallMs(FLOW_TTFT_TARGET_MODEL_S, speed)} } }`,
      FLOW_LOCALITY_WAIT_MODEL_S,
    ),
};

/**
 * A preset with policy options, for runs that vary one knob: `kv-aware:ceilingRatio=0+hotRatio=1.5`
 * → `--policy kv-aware --policy-option ceilingRatio=0 --policy-option hotRatio=1.5`.
 */
function presetWithOptions(policy: string): string[] {
  const [name, opts] = policy.split(":", 2);
  const args = ["--policy", name];
  for (const kv of opts ? opts.split("+").filter(Boolean) : []) args.push("--policy-option", kv);
  return args;
}

/** Writes the workers file the servers discover the engines from. */
export function writeWorkersFile(dir: string, engines: readonly Engine[], blockSize: number): string {
  const file = join(dir, `workers-${engines.length}.json`);
  writeFileSync(
    file,
    JSON.stringify(
      engines.map((e, i) => ({
        id: `sim-${i}`,
        url: e.url,
        model: MODEL,
        servedModelNames: [MODEL],
        engine: "sim",
        blockSize,
        kvEvents: {
          endpoint: e.kvEndpoint,
          replayEndpoint: e.replayEndpoint ?? undefined,
          topic: "kv-events",
          framing: "seq",
        },
      })),
    ),
  );
  return file;
}

export interface Replicas {
  url: string;
  servers: Array<{ url: string; child: ChildProcess }>;
  pids: number[];
  close(): Promise<void>;
}

/**
 * How long a peer's announcement counts, in model seconds: past the longest queue wait of a
 * burst (Run F's TTFT p99 was ~5 model s); the server's clock is wall time, hence / speed.
 * FLEET_ROUTING_PEER_TTL_S overrides it (Run G's open question: a TTL near the bridge's life).
 */
const PEER_TTL_MODEL_S = Number(process.env.FLEET_ROUTING_PEER_TTL_S ?? 15);

async function startServer(
  policy: string,
  workersFile: string,
  workers: number,
  dir: string,
  readyTimeoutMs: number,
  speed: number,
  peerArgs: string[],
): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  let policyArgs = presetWithOptions(policy);
  const composed = COMPOSED_PROFILES[policy];
  if (composed) {
    const file = join(dir, `${policy.replace(/[^a-z0-9-]/gi, "_")}.yaml`);
    writeFileSync(file, composed(speed));
    policyArgs = ["--config", file];
  }
  const child = spawn(
    process.execPath,
    [
      join(ROOT, "bin/infera.js"),
      ...serverArgs(port),
      "--discovery",
      "static",
      "--workers-file",
      workersFile,
      ...policyArgs,
      "--scrape-interval",
      "250",
      ...peerArgs,
    ],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        INFERA_LOG_LEVEL: process.env.FLEET_ROUTING_SERVER_LOG ?? "warn",
        INFERA_PEERS_TTL_MS: String(Math.round((PEER_TTL_MODEL_S * 1000) / speed)),
      },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  killOnExit(child);
  let out = "";
  const keep = (b: Buffer) => {
    out = (out + b.toString()).slice(-20000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + readyTimeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`infera server exited: ${out}`);
    try {
      const r = await fetch(`${url}/ready`);
      if (r.ok && ((await r.json()) as { workers: number }).workers === workers) break;
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) {
      killChild(child);
      throw new Error(`infera server not ready: ${out}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url, child };
}

/**
 * `n` replicas of `policy` behind a round-robin balancer; with `share` (the default) and n > 1
 * they share routing state over a loopback ZMQ mesh, each binding one endpoint and following all.
 */
export async function startReplicas(
  policy: string,
  n: number,
  o: {
    workersFile: string;
    workers: number;
    dir: string;
    readyTimeoutMs: number;
    speed: number;
    share?: boolean;
  },
): Promise<Replicas> {
  const mesh =
    n > 1 && o.share !== false
      ? await Promise.all(Array.from({ length: n }, async () => `tcp://127.0.0.1:${await freePort()}`))
      : [];
  const peerArgs = (i: number) =>
    mesh.length > 0 ? ["--peers-bind", mesh[i], "--peers", mesh.join(",")] : [];
  const started = await Promise.allSettled(
    Array.from({ length: n }, (_, i) =>
      startServer(policy, o.workersFile, o.workers, o.dir, o.readyTimeoutMs, o.speed, peerArgs(i)),
    ),
  );
  const servers = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  if (servers.length < n) {
    await Promise.all(servers.map((s) => stopChild(s.child)));
    throw (started.find((s) => s.status === "rejected") as PromiseRejectedResult).reason;
  }
  const lb = await startBalancer(servers.map((s) => s.url));
  return {
    url: lb.url,
    servers,
    pids: servers.map((s) => s.child.pid ?? 0),
    async close() {
      await lb.close();
      await Promise.all(servers.map((s) => stopChild(s.child)));
    },
  };
}

/** The servers' routing decisions by reason, and KV-ingest trouble, from their /metrics. */
export async function decisionsOf(servers: Replicas["servers"]): Promise<string> {
  const per = await Promise.all(
    servers.map(async (s) => {
      const text = await fetchText(`${s.url}/metrics`).catch(
        (e: unknown) => `# ${String(e)}; server exit code ${s.child.exitCode}, signal ${s.child.signalCode}`,
      );
      const out: string[] = [];
      for (const m of text.matchAll(/^infera_routing_decisions_total\{([^}]*)\} (\d+)/gm)) {
        const reason = /reason="([^"]*)"/.exec(m[1])?.[1];
        if (reason) out.push(`${reason}=${m[2]}`);
      }
      for (const m of text.matchAll(
        /^infera_kv_(worker_resets|malformed_messages)_total(\{[^}]*\})? (\d+)/gm,
      ))
        if (m[3] !== "0") out.push(`${m[1]}=${m[3]}`);
      // Shared routing state (src/router/peers): announcements sent, taken, dropped by reason.
      for (const m of text.matchAll(
        /^infera_peer_announcements_(sent|received|dropped)_total(\{[^}]*\})? (\d+)/gm,
      )) {
        const reason = m[2] ? /reason="([^"]*)"/.exec(m[2])?.[1] : undefined;
        if (m[3] !== "0") out.push(`peer_${m[1]}${reason ? `_${reason}` : ""}=${m[3]}`);
      }
      // Flow control (src/router/flow): locality outcomes and rejections by reason.
      for (const m of text.matchAll(/^infera_flow_(locality|rejections)_total\{([^}]*)\} (\d+)/gm)) {
        const label = /(?:outcome|reason)="([^"]*)"/.exec(m[2])?.[1];
        if (label && m[3] !== "0") out.push(`flow_${m[1]}_${label}=${m[3]}`);
      }
      // The TTFT predictor's mean relative error (src/router/predict), when anything used it.
      const sum = /^infera_ttft_prediction_relative_error_sum(?:\{[^}]*\})? (\S+)/m.exec(text);
      const count = /^infera_ttft_prediction_relative_error_count(?:\{[^}]*\})? (\S+)/m.exec(text);
      if (sum && count && Number(count[1]) > 0) {
        out.push(`ttft_rel_err_mean=${(Number(sum[1]) / Number(count[1])).toFixed(2)}(n=${count[1]})`);
        // Median and p90 (issue #29's goal: ≤ 0.25, ≤ 0.6), interpolated within the histogram's buckets.
        const buckets = [
          ...text.matchAll(/^infera_ttft_prediction_relative_error_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)/gm),
        ].map((m) => [m[1] === "+Inf" ? Number.POSITIVE_INFINITY : Number(m[1]), Number(m[2])] as const);
        const q = (p: number) => histogramQuantile(buckets, p).toFixed(2);
        out.push(`ttft_rel_err_p50=${q(0.5)} ttft_rel_err_p90=${q(0.9)}`);
      }
      return out.join(" ");
    }),
  );
  return per.join(" | ");
}

/** Quantile `p` of a Prometheus histogram's cumulative (le, count) buckets, linear within a bucket. */
function histogramQuantile(buckets: ReadonlyArray<readonly [number, number]>, p: number): number {
  const total = buckets.find(([le]) => le === Number.POSITIVE_INFINITY)?.[1] ?? 0;
  if (total === 0) return Number.NaN;
  const rank = p * total;
  let lo = 0;
  let below = 0;
  for (const [le, n] of buckets) {
    if (n >= rank) {
      if (!Number.isFinite(le)) return lo;
      return lo + ((le - lo) * (rank - below)) / Math.max(1, n - below);
    }
    lo = le;
    below = n;
  }
  return lo;
}
