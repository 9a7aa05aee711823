/**
 * The server config schema (issue #18 "One config schema"): each layer validated on its own with
 * errors naming the layer and the key, strict objects, field-by-field merge of nested objects,
 * the deprecated policyOptions aliases of the new `disagg` / `ingest` sections, the INFERA_*
 * table (complete, and what docs/configuration.md shows), and `infera server --print-config`.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { parse as parseYaml } from "yaml";
import { flagsToConfig } from "../../src/cli/server.ts";
import { renderConfigDoc } from "../../src/config/doc.ts";
import { ENV_TABLE } from "../../src/config/env-table.ts";
import { plain, renderCluster } from "../../src/deploy/render/index.ts";
import { parseClusterDocument } from "../../src/deploy/spec.ts";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { AutoRouter } from "../../src/router/auto.ts";
import { buildScheduling } from "../../src/router/pipeline/build.ts";
import type { DisaggFactoryContext } from "../../src/router/types.ts";
import { WorkerSet } from "../../src/router/worker-set.ts";
import {
  ConfigError,
  configFromEnv,
  configFromFile,
  mergeConfig,
  resolveServerConfig,
} from "../../src/server/config.ts";
import { parseLayer } from "../../src/server/config-schema.ts";
import { createLogger } from "../../src/util/log.ts";
import { spawnInfera } from "../helpers/infera.ts";
import { mixedRecord } from "../helpers/records.ts";

const logger = createLogger("test");
logger.level = "silent";
const ROOT = fileURLToPath(new URL("../../", import.meta.url));

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), "infera-config-"));
});
after(() => rmSync(dir, { recursive: true, force: true }));

let n = 0;
function file(text: string, ext = "yaml"): string {
  const p = join(dir, `c${n++}.${ext}`);
  writeFileSync(p, text);
  return p;
}

/** The problems of a ConfigError thrown by `fn`. */
function problems(fn: () => unknown): string[] {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof ConfigError, `expected a ConfigError, got ${e}`);
    return [...e.problems];
  }
  assert.fail("expected a ConfigError");
}

const quiet = { warn: () => {} };

describe("layers: defaults < file < env < flags", () => {
  it("each layer wins over the one before, key by key", () => {
    const f = file("port: 9001\nhost: 0.0.0.0\nmaxRetries: 5\npolicy: kv-aware\n");
    const c = resolveServerConfig(flagsToConfig({ port: "9003" }), f, {
      env: { INFERA_PORT: "9002", INFERA_MAX_RETRIES: "4" },
      ...quiet,
    });
    assert.equal(c.port, 9003);
    assert.equal(c.maxRetries, 4);
    assert.equal(c.host, "0.0.0.0");
    assert.equal(c.policy, "kv-aware");
    assert.equal(c.scrapeIntervalMs, 2000, "defaults under everything");
  });

  it("--drain-timeout is a config key too (file, INFERA_DRAIN_TIMEOUT_S, flag)", () => {
    const f = file("drainTimeoutS: 5\n");
    assert.equal(resolveServerConfig({}, f, { env: {} }).drainTimeoutS, 5);
    assert.equal(resolveServerConfig({}, f, { env: { INFERA_DRAIN_TIMEOUT_S: "7" } }).drainTimeoutS, 7);
    const flags = flagsToConfig({ drainTimeout: "1.5" });
    assert.equal(resolveServerConfig(flags, f, { env: { INFERA_DRAIN_TIMEOUT_S: "7" } }).drainTimeoutS, 1.5);
  });
});

describe("errors name the layer and the key", () => {
  it("the file: nested paths with list indexes", () => {
    const f = file("discovery:\n  workers: [http://a:1, 7]\nupstream:\n  bodyTimeoutMs: soon\n");
    const p = problems(() => configFromFile(f));
    assert.deepEqual(p, [
      `--config ${f}: discovery.workers[1]: expected a string (worker URLs), got 7`,
      `--config ${f}: upstream.bodyTimeoutMs: expected an integer >= 0 (upstream body timeout), got "soon"`,
    ]);
  });

  it("the environment: the variable's name", () => {
    assert.deepEqual(
      problems(() => configFromEnv({ INFERA_PORT: "abc" })),
      ['env INFERA_PORT: expected an integer 0..65535 (port), got "abc"'],
    );
    assert.deepEqual(
      problems(() => configFromEnv({ INFERA_METRICS_PUBLIC: "maybe", INFERA_ROUTER: "fast" })).sort(),
      [
        'env INFERA_METRICS_PUBLIC: expected true or false (public /metrics), got "maybe"',
        'env INFERA_ROUTER: expected auto, mixed or disagg (router), got "fast"',
      ],
    );
  });

  it("the flags: the flag's name", () => {
    assert.deepEqual(
      problems(() => flagsToConfig({ port: "80a" })),
      ['--port: expected an integer 0..65535 (port), got "80a"'],
    );
    assert.match(
      problems(() => flagsToConfig({ maxBodySize: "lots" }))[0]!,
      /^--max-body-size: invalid size/,
    );
    assert.deepEqual(
      problems(() => flagsToConfig({ kvTemperature: "hot" })),
      ['--kv-temperature: expected a number, got "hot"'],
    );
    assert.deepEqual(
      problems(() => flagsToConfig({ natsReconnectWaitMs: "-1" })),
      ["--nats-reconnect-wait-ms: expected an integer >= 0 (NATS reconnect wait), got -1"],
    );
  });

  it("every layer's problems are reported together", () => {
    const f = file("port: high\n");
    const p = problems(() =>
      resolveServerConfig(() => flagsToConfig({ maxRetries: "x" }), f, {
        env: { INFERA_SCRAPE_INTERVAL_MS: "-5" },
      }),
    );
    assert.deepEqual(
      p.map((l) => l.split(":")[0]),
      [`--config ${f}`, "env INFERA_SCRAPE_INTERVAL_MS", "--max-retries"],
    );
  });

  it("a profiles error carries its full path (the pipeline's schema is embedded)", () => {
    // Whatever profilesConfigSchema holds, an issue under it reads `profiles.<...>` with the layer.
    const r = parseLayerProblems({ profiles: 7 });
    assert.match(r[0]!, /^--config p\.yaml: profiles: /);
  });
});

describe("what other code writes passes the strict schema", () => {
  it("the server.yaml `infera deploy` renders for every example", () => {
    const dirPath = join(ROOT, "deploy/examples");
    const files = readdirSync(dirPath).filter((f) => f.endsWith(".yaml"));
    assert.ok(files.length > 0);
    for (const f of files) {
      const doc = parseClusterDocument(parseYaml(readFileSync(join(dirPath, f), "utf8")));
      const maps = renderCluster(doc, { secrets: "generate" })
        .map(plain)
        .filter((o) => (o.data as Record<string, string> | undefined)?.["server.yaml"] !== undefined);
      assert.ok(maps.length > 0, f);
      for (const m of maps) {
        const text = (m.data as Record<string, string>)["server.yaml"]!;
        assert.doesNotThrow(() => configFromFile(file(text)), f);
      }
    }
  });
});

function parseLayerProblems(layer: unknown): string[] {
  return problems(() => parseLayer(layer, { label: "--config p.yaml" }));
}

describe("strict: an unknown key is an error, never ignored", () => {
  it("top level and nested", () => {
    const f = file("prot: 8000\nnats:\n  url: nats://h:1\n  tls:\n    cafile: /x\n");
    assert.deepEqual(problems(() => configFromFile(f)).sort(), [
      `--config ${f}: nats.tls.cafile: unknown key`,
      `--config ${f}: prot: unknown key`,
    ]);
  });

  it("etcd options are checked even when the kind comes from another layer", () => {
    const f = file("discovery:\n  options:\n    usrname: me\n");
    assert.deepEqual(
      problems(() => resolveServerConfig(flagsToConfig({ discovery: "etcd" }), f, { env: {} })),
      [`--config ${f}: discovery.options.usrname: unknown key`],
    );
    // In the same layer too.
    const g = file("discovery:\n  kind: moriio\n  options:\n    model: m\n    prot: 1\n");
    assert.deepEqual(
      problems(() => configFromFile(g)),
      [`--config ${g}: discovery.options.prot: unknown key`],
    );
    // A plug-in backend's options are its own to check.
    const h = file("discovery:\n  kind: my-registry\n  options:\n    anything: 1\n");
    assert.deepEqual(configFromFile(h).discovery?.options, { anything: 1 });
  });

  it("etcd credentials in the environment do not break another backend", () => {
    const c = resolveServerConfig(
      flagsToConfig({ discovery: "moriio" }),
      file("discovery: {options: {model: m}}\n"),
      {
        env: { INFERA_ETCD_PASSWORD: "pw" },
      },
    );
    assert.equal(c.discovery.kind, "moriio");
  });

  it("a JSON file and a file that is not a mapping", () => {
    const j = file(JSON.stringify({ port: 1, nope: true }), "json");
    assert.deepEqual(
      problems(() => configFromFile(j)),
      [`--config ${j}: nope: unknown key`],
    );
    const l = file("- a\n- b\n");
    assert.deepEqual(
      problems(() => configFromFile(l)),
      [`--config ${l}: expected a mapping of config keys`],
    );
  });
});

describe("nested objects merge field by field", () => {
  it("a --nats-url flag keeps the file's NATS credentials (the old merge dropped them)", () => {
    const f = file("nats:\n  url: nats://file:4222\n  user: u\n  password: p\n  tls:\n    caFile: /ca.pem\n");
    const c = resolveServerConfig(flagsToConfig({ natsUrl: "nats://flag:4222", natsTlsCert: "/c.pem" }), f, {
      env: { INFERA_NATS_TOKEN: "t" },
    });
    assert.deepEqual(c.nats, {
      url: "nats://flag:4222",
      user: "u",
      password: "p",
      token: "t",
      tls: { caFile: "/ca.pem", certFile: "/c.pem" },
    });
    assert.equal(c.requestPlane, "nats");
  });

  it("env NATS settings without a URL still join the file's URL", () => {
    const f = file("nats:\n  url: nats://file:4222\n");
    const c = resolveServerConfig({}, f, { env: { INFERA_NATS_PASSWORD: "pw", INFERA_NATS_USER: "u" } });
    assert.deepEqual(c.nats, { url: "nats://file:4222", user: "u", password: "pw" });
  });

  it("discovery options from the file and the etcd flags combine; lists replace", () => {
    const f = file(
      "discovery:\n  kind: etcd\n  etcdEndpoints: [http://a:2379]\n  options:\n    startTimeoutMs: 100\n",
    );
    const c = resolveServerConfig(flagsToConfig({ etcdUser: "me", etcd: ["http://b:2379"] }), f, { env: {} });
    assert.deepEqual(c.discovery.options, { startTimeoutMs: 100, username: "me" });
    assert.deepEqual(c.discovery.etcdEndpoints, ["http://b:2379"]);
  });
});

describe("deprecated policyOptions keys land in disagg / ingest", () => {
  it("--policy-option and the file's policyOptions, with a warning naming the layer", () => {
    const warnings: string[] = [];
    const f = file("policyOptions:\n  kvReplayTimeoutMs: 500\n  overlapWeight: 2\n");
    const c = resolveServerConfig(
      () =>
        flagsToConfig(
          { policyOption: ["prefillTimeoutMs=300", "pdFallbackMixed=true", "kvMaxBlocksPerWorker=1000"] },
          { warn: (m) => warnings.push(m) },
        ),
      f,
      { env: {}, warn: (m) => warnings.push(m) },
    );
    assert.deepEqual(c.disagg, { prefillTimeoutMs: 300, pdFallbackMixed: true });
    assert.deepEqual(c.ingest, { kvReplayTimeoutMs: 500, kvMaxBlocksPerWorker: 1000 });
    assert.deepEqual(c.policyOptions, { overlapWeight: 2 }, "the preset's own knobs stay");
    assert.equal(warnings.length, 4);
    assert.ok(
      warnings.some((w) => w.startsWith(`--config ${f}: policyOptions.kvReplayTimeoutMs is deprecated`)),
    );
    assert.ok(warnings.some((w) => w.startsWith("--policy-option prefillTimeoutMs is deprecated")));
  });

  it("the typed key of the same layer wins; a bad alias value names the option", () => {
    const c = mergeConfig({ disagg: { decodeTimeoutMs: 9 }, policyOptions: { decodeTimeoutMs: 5 } });
    assert.equal(c.disagg.decodeTimeoutMs, 9);
    assert.deepEqual(
      problems(() => flagsToConfig({ policyOption: ["maxPrefillAttempts=none"] }, quiet)),
      ['--policy-option maxPrefillAttempts: expected an integer >= 1 (prefill attempts), got "none"'],
    );
  });

  it("trackPrefill is retired: dropped with a warning saying the profiles' needs decide it", () => {
    const warnings: string[] = [];
    const f = file("policyOptions:\n  trackPrefill: false\n  overlapWeight: 2\n");
    const c = resolveServerConfig(
      () => flagsToConfig({ policyOption: ["trackPrefill=true"] }, { warn: (m) => warnings.push(m) }),
      f,
      { env: {}, warn: (m) => warnings.push(m) },
    );
    assert.deepEqual(c.policyOptions, { overlapWeight: 2 });
    assert.deepEqual(warnings.sort(), [
      "--config " +
        f +
        ": policyOptions.trackPrefill is deprecated and ignored: the routing profiles' needs decide whether prompt tokens count as pending prefill",
      "--policy-option trackPrefill is deprecated and ignored: the routing profiles' needs decide whether prompt tokens count as pending prefill",
    ]);
  });

  it("the AutoRouter hands the disagg section to the DisaggRouter factory", () => {
    const cfg = mergeConfig({ policyOptions: { prefillTimeoutMs: 1234, maxPrefillAttempts: 2 } });
    const mem = new MemoryDiscovery([
      mixedRecord({ id: "p", model: "m", url: "http://127.0.0.1:1/p", role: "prefill" }),
      mixedRecord({ id: "d", model: "m", url: "http://127.0.0.1:1/d", role: "decode" }),
    ]);
    const ws = new WorkerSet(mem, { logger });
    ws.attach();
    let seen: DisaggFactoryContext | undefined;
    const auto = new AutoRouter({
      workers: ws,
      scheduling: buildScheduling({ policy: cfg.policy, policyOptions: cfg.policyOptions, router: "disagg" }),
      disagg: cfg.disagg,
      mode: "disagg",
      logger,
      disaggFactory: (ctx) => {
        seen = ctx;
        return { kind: "disagg", handle: () => Promise.reject(new Error("unused")) };
      },
    });
    auto.routerFor("m");
    assert.deepEqual(seen?.disagg, { prefillTimeoutMs: 1234, maxPrefillAttempts: 2 });
    assert.deepEqual(seen?.options, {});
    auto.close();
  });
});

describe("the INFERA_* table", () => {
  function* tsFiles(d: string): Generator<string> {
    for (const e of readdirSync(d)) {
      const p = join(d, e);
      if (statSync(p).isDirectory()) yield* tsFiles(p);
      else if (/\.(ts|mts|mjs|js)$/.test(e)) yield p;
    }
  }

  it("names every variable used in src/", () => {
    const known = new Set(ENV_TABLE.map((e) => e.name));
    const missing: string[] = [];
    for (const p of tsFiles(join(ROOT, "src"))) {
      // A name ending in "_" is a prefix in prose (INFERA_NATS_*), not a variable.
      for (const m of readFileSync(p, "utf8").matchAll(/INFERA_[A-Z0-9_]+/g))
        if (!m[0].endsWith("_") && !known.has(m[0])) missing.push(`${m[0]} (${p.slice(ROOT.length)})`);
    }
    assert.deepEqual(missing, [], "add these to src/config/env-table.ts");
    assert.equal(known.size, ENV_TABLE.length, "no duplicates");
  });

  it("every server key in it is a key of the schema", () => {
    for (const e of ENV_TABLE.filter((x) => x.configKey)) {
      const enums: Record<string, string> = {
        INFERA_ROUTER: "auto",
        INFERA_EVENT_PLANE: "zmq",
        INFERA_HTTP_FRONT: "node",
      };
      const sample =
        enums[e.name] ??
        { integer: "1", number: "1", boolean: "1", list: "a", string: "a", path: "/a" }[e.type];
      const env = { [e.name]: sample };
      // A value of the variable's own type must pass: the key exists and has that type.
      assert.doesNotThrow(() => configFromEnv(env), `${e.name} → ${e.configKey}`);
    }
  });

  it("docs/configuration.md shows the table as it is (node scripts/gen-config-doc.ts)", () => {
    const doc = readFileSync(join(ROOT, "docs/configuration.md"), "utf8");
    assert.equal(doc, renderConfigDoc(doc));
  });
});

describe("infera server --print-config", () => {
  async function run(args: string[], env: Record<string, string> = {}) {
    const { proc, output } = spawnInfera(["server", ...args], { logLevel: "silent", env, stdout: true });
    const code = await new Promise<number | null>((res) => proc.on("exit", res));
    return { code, output: output() };
  }

  it("prints the merged config as YAML with secrets as *** and exits 0", async () => {
    const f = file(
      "port: 9100\nnats:\n  url: nats://h:4222\n  password: file-secret\ndiscovery:\n  kind: etcd\n  etcdEndpoints: [http://e:2379]\n",
    );
    const { code, output } = await run(
      // Secrets come from the environment: on argv they are refused (test/cli/argv-secrets.test.ts).
      ["--config", f, "--print-config"],
      {
        INFERA_API_KEYS: "key-one,key-two",
        INFERA_MAX_RETRIES: "4",
        INFERA_NATS_TOKEN: "tok-secret",
        INFERA_ETCD_PASSWORD: "etcd-secret",
      },
    );
    assert.equal(code, 0, output);
    for (const secret of ["file-secret", "tok-secret", "etcd-secret", "key-one", "key-two"])
      assert.ok(!output.includes(secret), `${secret} leaked`);
    const c = parseYaml(output) as {
      port: number;
      maxRetries: number;
      apiKeys: string[];
      nats: Record<string, string>;
      discovery: { options: Record<string, string> };
      requestPlane: string;
    };
    assert.equal(c.port, 9100);
    assert.equal(c.maxRetries, 4);
    assert.deepEqual(c.apiKeys, ["***", "***"]);
    assert.deepEqual(c.nats, { url: "nats://h:4222", password: "***", token: "***" });
    assert.equal(c.discovery.options.password, "***");
    assert.equal(c.requestPlane, "nats");
  });

  it("a bad layer: exit 2 naming the variable, nothing printed on stdout", async () => {
    const { code, output } = await run(["--print-config"], { INFERA_PORT: "eighty" });
    assert.equal(code, 2);
    assert.match(output, /env INFERA_PORT: expected an integer 0\.\.65535 \(port\), got "eighty"/);
  });
});
