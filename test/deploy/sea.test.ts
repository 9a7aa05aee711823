/**
 * The single-executable `infera` (deploy/build-sea.mjs) runs with no node_modules and no
 * sources beside it: `--help`, `engine vllm --dry-run` (what engine pods run, flags and all),
 * and `deploy crd`. Builds a ~120 MB file in a temp dir (about 15 s).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";
import { crdYaml } from "../../src/deploy/crd.ts";

const run = promisify(execFile);
const build = mkdtempSync(join(tmpdir(), "infera-sea-build-"));
const bare = mkdtempSync(join(tmpdir(), "infera-sea-bare-"));
const exe = join(bare, "infera");

before(async () => {
  await run(process.execPath, ["deploy/build-sea.mjs", "--with-natives", join(build, "infera")], {
    maxBuffer: 16 << 20,
  });
  // Only the executable: no node_modules, no src/ next to it.
  copyFileSync(join(build, "infera"), exe);
});

after(() => {
  rmSync(bare, { recursive: true, force: true });
  rmSync(build, { recursive: true, force: true });
});

test("--with-natives: the addons beside the executable load with only what was copied", async () => {
  // What the executable does (build-sea.mjs nativeBesideExe): require from <dir>/node_modules.
  // A copy of the addon directories alone failed in an engine image with "Cannot find module
  // 'cmake-ts/build/loader'" (zeromq's loader); their run-time dependencies must come along.
  // The probe runs from the build dir, outside the repository, so nothing else resolves.
  const probe = `
    const req = require("node:module").createRequire(${JSON.stringify(join(build, "node_modules", "_"))});
    const z = req("zeromq"); new z.Subscriber().close();
    req("koffi").load("libc.so.6");
    if (typeof req("usocket").USocket !== "function") throw new Error("usocket");
    if (typeof req("msgpackr-extract").extractStrings !== "function") throw new Error("msgpackr-extract");
    process.stdout.write("ok " + z.version);`;
  const { stdout } = await run(process.execPath, ["-e", probe], {
    cwd: build,
    env: { PATH: process.env.PATH },
  });
  assert.match(stdout, /^ok \d+\.\d+\.\d+$/);
});

test("--help lists the commands", async () => {
  const { stdout } = await run(exe, ["--help"], { cwd: bare });
  for (const c of ["server", "engine", "kvd", "deploy", "operator"])
    assert.match(stdout, new RegExp(`\\n  ${c} `));
});

test("engine vllm --dry-run builds vLLM's command line and the worker record", async () => {
  const { stdout } = await run(
    exe,
    [
      "engine",
      "vllm",
      "--dry-run",
      "--model",
      "/models/m",
      "--role",
      "prefill",
      "--connector",
      "nixl",
      "--tp",
      "8",
      "--gid-index",
      "3",
      "--advertise-host",
      "10.0.0.5",
      "--worker-id",
      "w-0",
    ],
    { cwd: bare, env: { PATH: process.env.PATH } },
  );
  const out = JSON.parse(stdout) as {
    argv: string[];
    env: Record<string, string>;
    record: { id: string; url: string };
  };
  assert.deepEqual(out.argv.slice(0, 3), ["vllm", "serve", "/models/m"]);
  assert.ok(out.argv.includes("--kv-transfer-config"));
  assert.equal(out.env.NCCL_IB_GID_INDEX, "3");
  assert.equal(out.record.id, "w-0");
  assert.equal(out.record.url, "http://10.0.0.5:8000");
});

test("deploy crd prints the same CRD as the sources", async () => {
  const { stdout } = await run(exe, ["deploy", "crd"], { cwd: bare, maxBuffer: 16 << 20 });
  assert.equal(stdout, crdYaml());
});

test("a bad flag exits non-zero with the launcher's message", async () => {
  await assert.rejects(
    run(exe, ["engine", "vllm", "--dry-run", "--model", "m", "--tp", "zero"], { cwd: bare }),
    (e: { code: number; stderr: string }) => e.code === 2 && /--tp must be an integer/.test(e.stderr),
  );
});
