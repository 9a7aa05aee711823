import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { freePort } from "../helpers/ports.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";

const BIN = fileURLToPath(new URL("../../bin/infera.js", import.meta.url));

describe("infera server (CLI)", () => {
  let sim: SimProcess;
  let dir = "";
  let child: ReturnType<typeof spawn> | null = null;
  before(async () => {
    sim = await startSim({ args: ["--speed", "100"], timeoutMs: 60_000 });
    dir = mkdtempSync(join(tmpdir(), "infera-cli-"));
  });
  after(async () => {
    if (child && child.exitCode === null) child.kill("SIGKILL");
    await sim?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("takes flags over env over the config file, serves, and exits 0 on SIGTERM", async () => {
    const port = await freePort();
    const cfg = join(dir, "server.yaml");
    // The file asks for a port the flag overrides, and a body limit the env overrides.
    writeFileSync(cfg, `port: 1\nmaxBodyBytes: 999999\napiKeys: [file-key]\nscrapeIntervalMs: 0\n`);
    child = spawn(
      process.execPath,
      [BIN, "server", "--config", cfg, "--port", String(port), "--worker", sim.url],
      {
        // info level: the start-up logs must not carry the keys either.
        env: {
          ...process.env,
          INFERA_LOG_LEVEL: "info",
          INFERA_MAX_BODY_BYTES: "2048",
          INFERA_API_KEYS: "flag-key",
        },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let out = "";
    let err = "";
    child.stdout!.on("data", (d) => {
      out += d;
    });
    child.stderr!.on("data", (d) => {
      err += d;
    });
    const exited = new Promise<number | null>((r) => child!.once("exit", (code) => r(code)));
    const url = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 40_000;
    while (!out.includes("listening")) {
      if (child.exitCode !== null) assert.fail(`server exited: ${err}`);
      if (Date.now() > deadline) assert.fail(`server did not start: ${out}${err}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.match(out, new RegExp(`http://127\\.0\\.0\\.1:${port}`));
    const post = (body: string, key?: string) =>
      fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body,
      });
    const ok = JSON.stringify({
      model: "sim-model",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
    });
    assert.equal((await post(ok)).status, 401);
    assert.equal((await post(ok, "file-key")).status, 401, "the env's keys replace the file's");
    const good = await post(ok, "flag-key");
    assert.equal(good.status, 200);
    await good.json();
    const big = await post(
      JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "x".repeat(4000) }] }),
      "flag-key",
    );
    assert.equal(big.status, 413, "INFERA_MAX_BODY_BYTES beats the file");
    await big.text();
    assert.ok(!`${out}${err}`.includes("flag-key"), "API keys never appear in the output");
    child.kill("SIGTERM");
    assert.equal(await exited, 0);
  });
});
