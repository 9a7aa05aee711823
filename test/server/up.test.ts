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
    // The fleet's routes were asked of its engines: /tokenize passes through to them.
    const tok = await fetch(`${url}/tokenize`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "sim-model", prompt: "Hello!" }),
    });
    assert.equal(tok.status, 200);
    assert.ok(((await tok.json()) as { count: number }).count > 0);

    child.kill("SIGINT");
    assert.equal(await exited, 0);
    assert.ok(
      pids.every((p) => !alive(p)),
      "no orphaned sim processes",
    );
    await assert.rejects(fetch(`${url}/health`));
  });

  /** `infera up` with `args`; resolves once it printed its banner. */
  async function up(args: string[]) {
    const port = await freePort();
    const proc = spawn(process.execPath, [BIN, "up", "--port", String(port), ...args], {
      env: { ...process.env, INFERA_LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    proc.stdout!.on("data", (d) => {
      out += d;
    });
    proc.stderr!.on("data", (d) => {
      err += d;
    });
    const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
    const deadline = Date.now() + 40_000;
    while (!out.includes("Press Ctrl-C")) {
      if (proc.exitCode !== null) assert.fail(`infera up exited early: ${err}`);
      if (Date.now() > deadline) assert.fail(`infera up did not start: ${out}\n${err}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return { proc, exited, url: `http://127.0.0.1:${port}`, stderr: () => err };
  }

  const chat = (url: string, body: Record<string, unknown>) =>
    fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "Hello!" }], ...body }),
    });

  // A failed test's cleanup SIGKILLs `infera up`, which runs no exit handler: its fleet used to
  // stay behind (an orphaned `infera-sim --fleet 2` holding its ports). It now stops by itself.
  it("a SIGKILLed infera up leaves no sim fleet behind", async (t) => {
    const u = await up(["--workers", "2", "--speed", "100"]);
    const workers = (await (await fetch(`${u.url}/v1/workers`)).json()) as {
      data: Array<{ labels: { pid: string } }>;
    };
    const pid = Number(workers.data[0]!.labels.pid);
    t.after(() => {
      if (alive(pid)) process.kill(pid, "SIGKILL");
    });
    assert.ok(alive(pid));
    u.proc.kill("SIGKILL");
    await u.exited;
    const deadline = Date.now() + 15_000;
    while (alive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    assert.ok(!alive(pid), `sim fleet ${pid} outlived its infera up`);
  });

  // Issue #30 item 8: it stopped the fleet at once, and 6/6 streams ended in error events.
  it("drains on SIGTERM like infera server: streams in flight finish, then exit 0", async (t) => {
    const u = await up(["--workers", "2", "--speed", "0.2", "--drain-timeout", "30"]);
    t.after(() => u.proc.kill("SIGKILL"));
    const streams = await Promise.all(
      Array.from({ length: 4 }, () => chat(u.url, { max_tokens: 30, stream: true, ignore_eos: true })),
    );
    const texts = streams.map(async (res) => {
      let text = "";
      for await (const c of res.body!) text += Buffer.from(c).toString();
      return text;
    });
    await new Promise((r) => setTimeout(r, 300));
    u.proc.kill("SIGTERM");
    for (const text of await Promise.all(texts)) {
      assert.ok(!text.includes('"error"'), text.slice(-300));
      assert.ok(text.trimEnd().endsWith("data: [DONE]"), text.slice(-300));
      assert.match(text, /"finish_reason":"length"/);
    }
    assert.equal(await u.exited, 0, u.stderr());
    assert.match(u.stderr(), /SIGTERM, draining/);
  });

  // Issue #30 item 12: a dead fleet is restarted (with backoff, said on stderr), and meanwhile
  // its model is answered 503 + Retry-After, not 404 model_not_found.
  it("restarts a dead fleet; meanwhile the model is 503 with Retry-After", async (t) => {
    const u = await up(["--workers", "2", "--speed", "100"]);
    t.after(() => u.proc.kill("SIGKILL"));
    const workers = (await (await fetch(`${u.url}/v1/workers`)).json()) as {
      data: Array<{ labels: { pid: string } }>;
    };
    const pid = Number(workers.data[0]!.labels.pid);
    process.kill(pid, "SIGKILL");
    const deadline = Date.now() + 5000;
    let gone: Response | null = null;
    while (Date.now() < deadline) {
      const r = await chat(u.url, { max_tokens: 2 });
      if (r.status !== 200) {
        gone = r;
        break;
      }
      await r.arrayBuffer();
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(gone, "the dead fleet's model was still answered 200");
    assert.equal(gone.status, 503);
    assert.ok(gone.headers.get("retry-after"));
    assert.equal(((await gone.json()) as { error: { code: string } }).error.code, "no_worker_available");
    // Restarted after its backoff: served again by a new fleet process.
    const back = Date.now() + 30_000;
    let ok = false;
    while (!ok && Date.now() < back) {
      const r = await chat(u.url, { max_tokens: 2 });
      ok = r.status === 200;
      await r.arrayBuffer();
      if (!ok) await new Promise((r) => setTimeout(r, 200));
    }
    assert.ok(ok, `not served again: ${u.stderr()}`);
    assert.match(u.stderr(), /exited \(SIGKILL\); its 2 workers removed; restarting in 1000 ms/);
    assert.match(u.stderr(), /sim fleet restarted/);
    const again = (await (await fetch(`${u.url}/v1/workers`)).json()) as {
      data: Array<{ labels: { pid: string } }>;
    };
    assert.equal(again.data.length, 2);
    assert.notEqual(Number(again.data[0]!.labels.pid), pid);
    u.proc.kill("SIGINT");
    assert.equal(await u.exited, 0);
  });
});
