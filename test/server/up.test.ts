import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { freePort } from "../helpers/ports.ts";

const BIN = fileURLToPath(new URL("../../bin/infera.js", import.meta.url));

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("infera up", () => {
  let child: ReturnType<typeof spawn> | null = null;
  after(() => {
    if (child && child.exitCode === null) child.kill("SIGKILL");
  });

  it("starts a server + 2 sims, answers, and stops everything on SIGINT", async () => {
    const port = await freePort();
    child = spawn(process.execPath, [BIN, "up", "--port", String(port), "--workers", "2", "--speed", "100"], {
      env: { ...process.env, INFERA_LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stdout!.on("data", (d) => {
      out += d;
    });
    child.stderr!.on("data", (d) => {
      err += d;
    });
    const exited = new Promise<number | null>((r) => child!.once("exit", (code) => r(code)));
    const deadline = Date.now() + 40_000;
    while (!out.includes("Press Ctrl-C")) {
      if (child.exitCode !== null) assert.fail(`infera up exited early: ${err}`);
      if (Date.now() > deadline) assert.fail(`infera up did not start: ${out}\n${err}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const url = `http://127.0.0.1:${port}`;
    assert.ok(out.includes(url), out);
    assert.match(out, /curl http:\/\/127\.0\.0\.1:\d+\/v1\/chat\/completions/);
    assert.match(err, /worker 2\/2 ready/);
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        messages: [{ role: "user", content: "Hello!" }],
        max_tokens: 4,
      }),
    });
    assert.equal(res.status, 200);
    assert.equal(((await res.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens, 4);
    const workers = (await (await fetch(`${url}/v1/workers`)).json()) as {
      data: Array<{ engine: string; labels: { pid: string }; kvEvents: { endpoint: string } }>;
    };
    assert.equal(workers.data.length, 2);
    const pids = workers.data.map((w) => Number(w.labels.pid));
    assert.ok(pids.every(alive));
    assert.ok(
      workers.data.every((w) => w.engine === "sim" && w.kvEvents.endpoint.startsWith("tcp://127.0.0.1:")),
    );

    child.kill("SIGINT");
    assert.equal(await exited, 0);
    assert.ok(
      pids.every((p) => !alive(p)),
      "no orphaned sim processes",
    );
    await assert.rejects(fetch(`${url}/health`));
  });
});
