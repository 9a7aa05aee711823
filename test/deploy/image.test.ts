/**
 * The container images, built and run for real with podman (scripts/build-image.sh): the
 * infera image from deploy/Containerfile on a Node base assembled from Debian's mirror and the
 * npm registry (no container registry is reachable here), and an engine-image stand-in with no
 * Node (deploy/engine-standin/). Checks:
 *  - the image runs as uid 10001 with its HEALTHCHECK, and `infera up` inside it serves a
 *    completion to the host, and the health check passes;
 *  - the engine pod's path: the init container's rendered command (`cp -R /infera/bin/. /shared/`) copies the
 *    single executable out of the infera image, and it runs in the Node-less engine image as
 *    `infera engine vllm` around a `vllm` stand-in: it registers in a real etcd and relays the
 *    engine's ZMQ KV events to a real NATS, i.e. zeromq loads from /infera/bin/node_modules.
 *
 * Skipped, with the reason, where podman or mmdebstrap is missing (scripts/install-system-deps.sh
 * installs them) or INFERA_IMAGE_TEST=0. The first build takes minutes; later ones reuse
 * podman's layer cache and the base rootfs cached under .cache/image.
 */
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";
import OpenAI from "openai";
import { parse } from "yaml";
import { plain, renderCluster } from "../../src/deploy/render/index.ts";
import { parseClusterDocument } from "../../src/deploy/spec.ts";
import { createEtcdClient } from "../../src/discovery/etcd-client.ts";
import { connectNats } from "../../src/transport/nats/connection.ts";
import { kvSubject } from "../../src/transport/nats/subjects.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { type NatsServerHandle, startNats } from "../helpers/nats.ts";
import { freePort } from "../helpers/ports.ts";
import { waitFor200, waitUntil } from "../helpers/wait.ts";

const run = promisify(execFile);
const IMAGE = process.env.INFERA_IMAGE ?? "localhost/infera:dev";
const STANDIN = "localhost/infera-engine-standin:bookworm";

function whyNot(): string | undefined {
  if (process.env.INFERA_IMAGE_TEST === "0") return "INFERA_IMAGE_TEST=0";
  for (const tool of ["podman", "mmdebstrap"]) {
    try {
      execFileSync("sh", ["-c", `command -v ${tool}`], { stdio: "ignore" });
    } catch {
      return `${tool} not installed (Debian package ${tool}; scripts/install-system-deps.sh installs it)`;
    }
  }
  // A host where podman itself cannot start (no storage driver, no user namespaces) cannot build
  // any image: that is the machine, not the image, and the reason is printed as the skip.
  try {
    execFileSync("podman", ["info", "--format", "{{.Store.GraphDriverName}}"], {
      stdio: ["ignore", "ignore", "pipe"],
      timeout: 60_000,
    });
  } catch (err) {
    const why = String((err as { stderr?: Buffer }).stderr ?? err)
      .trim()
      .split("\n")[0];
    return `podman cannot run on this host: podman info failed: ${why}`;
  }
  return undefined;
}
const skip = whyNot();

/** `podman` with the flags this host needs (runtime, rlimits: scripts/build-image.sh). */
let global: string[] = [];
let perContainer: string[] = [];
const podman = (args: string[], o: { timeout?: number } = {}) =>
  run("podman", [...global, ...args], { maxBuffer: 64 << 20, timeout: o.timeout ?? 120_000 });

const containers: string[] = [];
const tmp = mkdtempSync(join(tmpdir(), "infera-image-"));

before(async () => {
  if (skip) return;
  // Builds (or finds cached) the base, the Node base, the image and the stand-in.
  await run("bash", ["scripts/build-image.sh", "--engine-standin"], {
    maxBuffer: 256 << 20,
    timeout: 20 * 60_000,
    env: { ...process.env, INFERA_IMAGE: IMAGE },
  });
  const { stdout } = await run("bash", ["scripts/build-image.sh", "--print-podman-flags"]);
  const flags = stdout.trim().split("\n");
  const at = flags.indexOf("--runtime");
  global = at >= 0 ? flags.splice(at, 2) : [];
  perContainer = flags;
});

after(async () => {
  for (const c of containers) await podman(["rm", "-f", "-t", "2", c]).catch(() => {});
  rmSync(tmp, { recursive: true, force: true });
});

/** Starts a detached container; returns its name. */
async function runDetached(name: string, args: string[]): Promise<string> {
  await podman(["rm", "-f", name]).catch(() => {});
  await podman(["run", "-d", "--name", name, "--network", "host", ...perContainer, ...args]);
  containers.push(name);
  return name;
}
const logs = async (name: string) => {
  const { stdout, stderr } = await podman(["logs", name]).catch(() => ({ stdout: "", stderr: "" }));
  return `${stdout}${stderr}`.slice(-4000);
};

test("the image: non-root, a HEALTHCHECK, and the single executable beside the full program", {
  skip,
}, async () => {
  const inspect = async (field: string) =>
    JSON.parse(
      (await podman(["image", "inspect", IMAGE, "--format", `{{json ${field}}}`])).stdout,
    ) as unknown;
  assert.equal(await inspect(".Config.User"), "10001:10001");
  assert.deepEqual(await inspect(".Config.Entrypoint"), ["/usr/local/bin/infera"]);
  // Docker format: an OCI image config has no HEALTHCHECK (podman drops it with a warning).
  const hc = (await inspect(".Config.Healthcheck")) as { Test: string[] } | null;
  assert.match(hc?.Test.join(" ") ?? "", /\/health/);
  const id = await podman([
    "run",
    "--rm",
    ...perContainer,
    "--entrypoint",
    "sh",
    IMAGE,
    "-c",
    "id -u; ls /infera/bin /infera/bin/node_modules",
  ]);
  const [uid, ...files] = id.stdout.trim().split("\n");
  assert.equal(uid, "10001");
  for (const f of ["infera", "zeromq", "koffi", "usocket"])
    assert.ok(files.includes(f), `${f} in /infera/bin: ${files}`);
});

test("`infera up` inside the image serves a completion to the host, and the health check passes", {
  skip,
}, async () => {
  const port = await freePort();
  const name = await runDetached("infera-test-up", [
    "--env",
    `INFERA_PORT=${port}`,
    "--env",
    "INFERA_API_KEYS=sk-image",
    IMAGE,
    "up",
    "--workers",
    "1",
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
  ]);
  await waitFor200(`http://127.0.0.1:${port}/ready`, {
    timeoutMs: 90_000,
    what: "infera up in the container",
    stepMs: 250,
    output: () => "(see podman logs)",
  }).catch(async (e) => {
    throw new Error(`${(e as Error).message}\n${await logs(name)}`);
  });
  const openai = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "sk-image", maxRetries: 0 });
  const res = await openai.chat.completions.create({
    model: "sim-model",
    messages: [{ role: "user", content: "hello from the host" }],
    max_tokens: 4,
  });
  assert.ok((res.choices[0]?.message.content ?? "").length > 0);
  // The image's own HEALTHCHECK, run once by podman inside the container (exit 0 = healthy).
  // It reads INFERA_PORT (the server's port; `up` was given it as a flag).
  await podman(["healthcheck", "run", name]);
});

test("engine pod path: the executable copied out of the image runs in a Node-less engine image, registers, relays KV events", {
  skip,
}, async () => {
  // The emptyDir the init container fills (world-writable, as an emptyDir is).
  const shared = join(tmp, "infera-bin");
  execFileSync("mkdir", ["-p", shared]);
  chmodSync(shared, 0o777);
  // The init container exactly as rendered (deploy/examples/mixed.yaml): image, command, user.
  const doc = parseClusterDocument(parse(readFileSync("deploy/examples/mixed.yaml", "utf8")));
  const sts = renderCluster(doc)
    .map(plain)
    .find(
      (o) => o.kind === "StatefulSet" && String((o.metadata as { name: string }).name).endsWith("-mixed"),
    ) as {
    spec: { template: { spec: { initContainers: { command: string[] }[] } } };
  };
  const init = sts.spec.template.spec.initContainers[0]!;
  assert.equal(init.command.at(-1), "/shared/");
  await podman([
    "run",
    "--rm",
    ...perContainer,
    "-v",
    `${shared}:/shared`,
    "--entrypoint",
    init.command[0]!,
    IMAGE,
    ...init.command.slice(1),
  ]);
  // The engine image has no Node.
  await assert.rejects(
    podman(["run", "--rm", ...perContainer, "--entrypoint", "sh", STANDIN, "-c", "command -v node"]),
  );

  let etcd: EtcdHandle | undefined;
  let nats: NatsServerHandle | undefined;
  try {
    etcd = await startEtcd();
    nats = await startNats();
    const nc = await connectNats({ url: nats.url });
    const workerId = "standin-0";
    const sub = nc.subscribe(kvSubject("m", workerId), { max: 3 });
    const port = await freePort();
    const kvPort = await freePort();
    const replayPort = await freePort();
    const name = await runDetached("infera-test-engine", [
      "-v",
      `${shared}:/infera/bin:ro`,
      "--entrypoint",
      "/infera/bin/infera",
      STANDIN,
      "engine",
      "vllm",
      "--model",
      "m",
      "--worker-id",
      workerId,
      "--host",
      "127.0.0.1",
      "--advertise-host",
      "127.0.0.1",
      "--port",
      String(port),
      "--kv-events-port",
      String(kvPort),
      "--kv-events-replay-port",
      String(replayPort),
      "--etcd",
      etcd.endpoint,
      "--nats-url",
      nats.url,
    ]);
    // Registered in etcd (the record the server discovers).
    const client = createEtcdClient({ endpoints: [etcd.endpoint] });
    try {
      await waitUntil(
        async () => (await client.getAll().prefix("/infera/workers/").keys()).length > 0,
        60_000,
        "the worker record in etcd",
        250,
      ).catch(async (e) => {
        throw new Error(`${(e as Error).message}\n${await logs(name)}`);
      });
      const records = await client.getAll().prefix("/infera/workers/").strings();
      const rec = JSON.parse(Object.values(records)[0]!) as { id: string; url: string; engine: string };
      assert.equal(rec.id, workerId);
      assert.equal(rec.engine, "vllm");
      assert.equal(rec.url, `http://127.0.0.1:${port}`);
      // KV events: python's pyzmq PUB → the executable's zeromq SUB → NATS, payload intact.
      const got: Uint8Array[] = [];
      const timer = setTimeout(() => sub.unsubscribe(), 30_000);
      for await (const m of sub) got.push(m.data);
      clearTimeout(timer);
      assert.equal(got.length, 3, `KV batches relayed from the stand-in\n${await logs(name)}`);
      for (const d of got) assert.ok(Buffer.from(d).includes(Buffer.from("BlockStored")));
      // SIGTERM (podman stop): the launcher deregisters first, then stops its engine.
      await podman(["stop", "-t", "20", name]);
      assert.deepEqual(await client.getAll().prefix("/infera/workers/").keys(), []);
      assert.match(await logs(name), /worker deregistered/);
    } finally {
      client.close();
      await nc.close();
    }
  } finally {
    await etcd?.dispose();
    await nats?.close();
  }
});
