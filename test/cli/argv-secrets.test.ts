/**
 * Secrets never on argv: every user of the host reads a process's command line (ps,
 * /proc/PID/cmdline). Each secret-valued flag of `infera server`, `engine`, `up` and `bench` is
 * refused when given on the command line — exit 2, one line naming the environment variable that
 * takes it, the secret itself never echoed — and the same value from the environment still works.
 * Real `infera` processes.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { parse as parseYaml } from "yaml";
import { exitWithin, spawnInfera } from "../helpers/infera.ts";

/** Runs `infera ARGS`, bounded: a command that took the secret could run for ever. */
async function run(args: string[], env: Record<string, string> = {}) {
  const { proc, output } = spawnInfera(args, { logLevel: "silent", env, stdout: true });
  const code = await exitWithin(proc, 20_000);
  return { code, output: output() };
}

const CASES: { args: string[]; secret: string; env: string }[] = [
  { args: ["server", "--api-key", "sk-argv-1"], secret: "sk-argv-1", env: "INFERA_API_KEYS" },
  { args: ["server", "--etcd-password", "etcd-pw-2"], secret: "etcd-pw-2", env: "INFERA_ETCD_PASSWORD" },
  { args: ["server", "--nats-password", "nats-pw-3"], secret: "nats-pw-3", env: "INFERA_NATS_PASSWORD" },
  { args: ["server", "--nats-token", "nats-tok-4"], secret: "nats-tok-4", env: "INFERA_NATS_TOKEN" },
  {
    args: ["server", "--nats-url", "nats://u:nats-pw-5@127.0.0.1:4222"],
    secret: "nats-pw-5",
    env: "INFERA_NATS_URL",
  },
  {
    // A lone userinfo is NATS's token form.
    args: ["server", "--nats-url", "nats://127.0.0.1:4222,nats://nats-tok-6@127.0.0.1:4223"],
    secret: "nats-tok-6",
    env: "INFERA_NATS_URL",
  },
  {
    args: ["server", "--discovery", "etcd", "--etcd", "http://root:etcd-pw-7@127.0.0.1:2379"],
    secret: "etcd-pw-7",
    env: "INFERA_ETCD",
  },
  {
    args: ["engine", "sim", "--model", "m", "--etcd-password", "etcd-pw-8"],
    secret: "etcd-pw-8",
    env: "INFERA_ETCD_PASSWORD",
  },
  {
    args: ["engine", "sim", "--model", "m", "--nats-token", "nats-tok-9"],
    secret: "nats-tok-9",
    env: "INFERA_NATS_TOKEN",
  },
  {
    args: ["engine", "sim", "--model", "m", "--nats-password", "nats-pw-10"],
    secret: "nats-pw-10",
    env: "INFERA_NATS_PASSWORD",
  },
  {
    args: ["engine", "sim", "--model", "m", "--etcd-endpoints", "http://u:etcd-pw-11@127.0.0.1:2379"],
    secret: "etcd-pw-11",
    env: "INFERA_ETCD_ENDPOINTS",
  },
  { args: ["up", "--api-key", "sk-argv-12"], secret: "sk-argv-12", env: "INFERA_API_KEYS" },
  {
    args: ["bench", "--url", "http://127.0.0.1:1", "--model", "m", "--api-key", "sk-argv-13"],
    secret: "sk-argv-13",
    env: "INFERA_API_KEY",
  },
];

test("each secret-valued flag on argv: exit 2, names its env var, never echoes the secret", async () => {
  // `engine --dry-run` and `server --print-config` would exit 0 at once if the flag were taken;
  // `up` and `bench` would start serving / sending, which the bounded wait catches.
  const results = await Promise.all(
    CASES.map(async (c) => {
      const extra = c.args[0] === "server" ? ["--print-config"] : c.args[0] === "engine" ? ["--dry-run"] : [];
      return { c, ...(await run([...c.args, ...extra])) };
    }),
  );
  for (const { c, code, output } of results) {
    const flag = c.args.find((a, i) => a.startsWith("--") && c.args[i + 1]?.includes(c.secret))!;
    assert.equal(code, 2, `${c.args.join(" ")}: ${output}`);
    assert.ok(output.includes(c.env), `${flag} names ${c.env}: ${output}`);
    assert.ok(output.includes(flag), `names ${flag}: ${output}`);
    assert.ok(!output.includes(c.secret), `${flag} echoed the secret: ${output}`);
    assert.equal(output.trim().split("\n").length, 1, `one line: ${output}`);
  }
});

test("the same secrets from the environment are taken (and printed masked)", async () => {
  const { code, output } = await run(["server", "--print-config", "--nats-url", "nats://127.0.0.1:4222"], {
    INFERA_NATS_PASSWORD: "env-nats-pw",
    INFERA_NATS_USER: "infera",
    INFERA_API_KEYS: "env-key-1",
    INFERA_ETCD_PASSWORD: "env-etcd-pw",
  });
  assert.equal(code, 0, output);
  for (const s of ["env-nats-pw", "env-key-1", "env-etcd-pw"]) assert.ok(!output.includes(s), `${s} printed`);
  const c = parseYaml(output) as {
    apiKeys: string[];
    nats: Record<string, string>;
    discovery: { options: Record<string, string> };
  };
  assert.deepEqual(c.apiKeys, ["***"]);
  assert.equal(c.nats.password, "***");
  assert.equal(c.nats.user, "infera");
  assert.equal(c.discovery.options.password, "***");
});

test("a URL without a password on argv is still taken", async () => {
  const { code, output } = await run([
    "server",
    "--print-config",
    "--discovery",
    "etcd",
    "--etcd",
    "http://127.0.0.1:2379",
    "--nats-url",
    "nats://127.0.0.1:4222",
  ]);
  assert.equal(code, 0, output);
  const c = parseYaml(output) as { nats: { url: string }; discovery: { etcdEndpoints: string[] } };
  assert.equal(c.nats.url, "nats://127.0.0.1:4222");
  assert.deepEqual(c.discovery.etcdEndpoints, ["http://127.0.0.1:2379"]);
});
