/**
 * `infera engine sim` as a real process against a real etcd: the record appears within 1 s
 * of the engine's health, goes at once on SIGTERM and when the engine dies, and within the
 * lease TTL when the launcher itself is killed with -9. "1 s" is for an idle box: a loaded one
 * gets an allowance in proportion to its measured round trips (`within`).
 */
import assert from "node:assert/strict";
import { type ChildProcess, execFileSync } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { EtcdWatcher } from "../../../src/discovery/etcd-watcher.ts";
import { type EtcdHandle, startEtcd } from "../../helpers/etcd.ts";
import { INFERA_BIN, spawnInfera } from "../../helpers/infera.ts";
import { engineListenArgs } from "../../helpers/launcher.ts";
import { freePort } from "../../helpers/ports.ts";
import { waitUntil } from "../../helpers/wait.ts";

interface Launched {
  proc: ChildProcess;
  /** The engine's pid once it has been spawned. */
  enginePid: () => Promise<number>;
  port: number;
  exited: Promise<number | null>;
  stderr: () => string;
}

async function healthy(port: number): Promise<boolean> {
  try {
    return (await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(300) })).ok;
  } catch {
    return false;
  }
}

describe("infera engine lifecycle (real etcd, real sim)", () => {
  let etcd: EtcdHandle;
  const launched: Launched[] = [];
  const watchers: EtcdWatcher[] = [];
  before(async () => {
    etcd = await startEtcd();
  });
  after(async () => {
    for (const l of launched) {
      // The launcher's group holds the engine too, unless the launcher was killed alone.
      for (const pid of [-(l.proc.pid as number), await l.enginePid().catch(() => 0)]) {
        try {
          if (pid !== 0) process.kill(pid, "SIGKILL");
        } catch {
          // already gone
        }
      }
    }
    for (const w of watchers) await w.close();
    await etcd?.dispose();
  });

  async function watcher(prefix: string): Promise<EtcdWatcher> {
    const w = new EtcdWatcher({ endpoints: [etcd.endpoint], prefix });
    watchers.push(w);
    await w.start();
    return w;
  }

  async function launch(prefix: string, id: string, extra: string[] = []): Promise<Launched> {
    const port = await freePort();
    const args = [
      "engine",
      "sim",
      "--model",
      "sim-model",
      "--worker-id",
      id,
      ...(await engineListenArgs(port)),
      "--etcd-endpoints",
      etcd.endpoint,
      "--etcd-prefix",
      prefix,
      "--lease-ttl",
      "2",
      ...extra,
    ];
    // Own process group, so the engine it starts can be cleaned up after a kill -9.
    const { proc, output } = spawnInfera(args, { logLevel: "warn", detached: true, keepChars: 8000 });
    const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
    // Found while the launcher is alive (after a kill -9 the engine is re-parented).
    const pidFound = (async () => {
      for (let i = 0; i < 300; i++) {
        try {
          const out = execFileSync("ps", ["-o", "pid=", "--ppid", String(proc.pid)])
            .toString()
            .trim();
          if (out !== "") return Number(out.split("\n")[0]);
        } catch {
          // no child yet
        }
        if (proc.exitCode !== null) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error("engine pid not found");
    })();
    pidFound.catch(() => undefined);
    const l = { proc, port, exited, stderr: output, enginePid: () => pidFound };
    launched.push(l);
    return l;
  }

  const has = (w: EtcdWatcher, id: string) => w.workers().some((r) => r.id === id);

  /**
   * Waits (up to 30 s) for `cond`, then checks it came within `limitMs` of `since` on this box's
   * current speed: `limitMs` is the spec's figure for an idle box, and the allowance grows by 20
   * times the slowest round trip to etcd's /health seen meanwhile. The launcher's steps are about
   * ten such round trips (a health poll, /v1/models, /metrics, the routes probe, the etcd write,
   * the watch), so a loaded CI box, where each takes longer, gets a proportionally longer limit,
   * while a launcher that waited on a periodic timer (the 5 s health check) would still fail.
   */
  async function within(since: number, limitMs: number, cond: () => boolean, what: string): Promise<void> {
    let slowest = 0;
    await waitUntil(
      async () => {
        if (cond()) return true;
        const p0 = performance.now();
        await fetch(`${etcd.endpoint}/health`, { signal: AbortSignal.timeout(5000) })
          .then((r) => r.arrayBuffer())
          .catch(() => undefined);
        slowest = Math.max(slowest, performance.now() - p0);
        return cond();
      },
      30_000,
      what,
    );
    const ms = performance.now() - since;
    const allowed = limitMs + 20 * slowest;
    assert.ok(
      ms <= allowed,
      `${what} after ${ms.toFixed(0)} ms; allowed ${allowed.toFixed(0)} (${limitMs} + 20 × ${slowest.toFixed(0)} ms)`,
    );
  }

  it("registers within 1 s of health with the engine's facts, and SIGTERM removes it at once", async () => {
    const w = await watcher("/lc1");
    const l = await launch("/lc1", "sim-a");
    await waitUntil(() => healthy(l.port), 30_000, `engine health (${l.stderr()})`);
    await within(performance.now(), 1000, () => has(w, "sim-a"), "record after health");
    const rec = w.workers().find((r) => r.id === "sim-a");
    assert.equal(rec?.url, `http://127.0.0.1:${l.port}`);
    assert.equal(rec?.engine, "sim");
    assert.equal(rec?.role, "mixed");
    assert.deepEqual(rec?.servedModelNames, ["sim-model"]);
    assert.equal(rec?.kvEvents?.framing, "seq");
    assert.match(rec?.kvEvents?.endpoint ?? "", /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.ok((rec?.maxModelLen ?? 0) > 0, "max_model_len read from /v1/models");
    // The routes the engine answered (src/engine/launcher/routes-probe.ts): the sim, a generative
    // model in vLLM's personality, serves Responses, Messages and the tokenizer routes, and no
    // pooling route.
    assert.deepEqual(rec?.routes, ["/v1/responses", "/v1/messages", "/tokenize", "/detokenize"]);

    const t0 = performance.now();
    l.proc.kill("SIGTERM");
    await within(t0, 1000, () => !has(w, "sim-a"), "record removed on SIGTERM");
    assert.equal(await l.exited, 0, `launcher exits with the engine's status (${l.stderr()})`);
    assert.equal(await healthy(l.port), false, "engine stopped");
  });

  it("SIGTERM drains: deregistered at once, the stream in flight finishes, then the engine stops", async () => {
    const w = await watcher("/lc6");
    // A slow engine (speed 0.1), so that the stream lasts seconds.
    const l = await launch("/lc6", "sim-f", ["--drain-timeout", "30", "--", "--speed", "0.1"]);
    await waitUntil(() => healthy(l.port), 30_000, `engine health (${l.stderr()})`);
    await waitUntil(() => has(w, "sim-f"), 30_000, "record after health");
    const res = await fetch(`http://127.0.0.1:${l.port}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        prompt: "drain me",
        max_tokens: 60,
        ignore_eos: true,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    assert.equal(res.status, 200);
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    const first = await reader.read();
    assert.ok(!first.done, "stream started");
    let text = Buffer.from(first.value).toString();
    const t0 = Date.now();
    const sent = performance.now();
    l.proc.kill("SIGTERM");
    await within(sent, 1000, () => !has(w, "sim-f"), "record removed at once on SIGTERM");
    for (;;) {
      const chunk = await reader.read();
      if (chunk.done) break;
      text += Buffer.from(chunk.value).toString();
    }
    const finishedAt = Date.now();
    assert.match(text, /data: \[DONE\]/, "the stream was not cut");
    assert.match(text, /"completion_tokens":60/, "every token arrived");
    assert.ok(finishedAt - t0 > 500, `the stream outlived the SIGTERM (${finishedAt - t0} ms)`);
    assert.equal(await l.exited, 0, `launcher exits with the engine's status (${l.stderr()})`);
    assert.equal(await healthy(l.port), false, "engine stopped after the drain");
  });

  it("an engine that dies takes its record with it at once; the launcher exits with its status", async () => {
    const w = await watcher("/lc2");
    const l = await launch("/lc2", "sim-b");
    await waitUntil(() => has(w, "sim-b"), 30_000, `record (${l.stderr()})`);
    const enginePid = Number(
      execFileSync("ps", ["-o", "pid=", "--ppid", String(l.proc.pid)])
        .toString()
        .trim(),
    );
    assert.ok(enginePid > 0);
    const t0 = performance.now();
    process.kill(enginePid, "SIGKILL");
    await within(t0, 1000, () => !has(w, "sim-b"), "record removed after engine death");
    assert.equal(await l.exited, 128 + 9);
  });

  it("kill -9 of the launcher: the record expires within the lease TTL", async () => {
    const w = await watcher("/lc3");
    const l = await launch("/lc3", "sim-c");
    await waitUntil(() => has(w, "sim-c"), 30_000, `record (${l.stderr()})`);
    const enginePid = await l.enginePid();
    const t0 = Date.now();
    l.proc.kill("SIGKILL");
    await waitUntil(() => !has(w, "sim-c"), 4000, "record expiry");
    // TTL 2 s plus etcd's lease-expiry tick.
    assert.ok(Date.now() - t0 <= 3500, `expired after ${Date.now() - t0} ms`);
    process.kill(enginePid, "SIGKILL"); // the orphaned engine
  });

  it("an engine that never gets healthy is stopped after --health-timeout (status 1); a missing binary gives 127", async () => {
    const hang = await launch("/lc6", "sim-f", [
      "--health-timeout",
      "1",
      "--engine-bin",
      "node -e 'setInterval(()=>{},1e3)'",
    ]);
    assert.equal(await hang.exited, 1, hang.stderr());
    const missing = await launch("/lc6", "sim-g", ["--engine-bin", "/nonexistent/engine"]);
    assert.equal(await missing.exited, 127, missing.stderr());
  });

  it("an engine that stops answering /health is deregistered, and registered again when it recovers", async () => {
    const w = await watcher("/lc5");
    const l = await launch("/lc5", "sim-e", ["--health-interval", "0.3"]);
    await waitUntil(() => has(w, "sim-e"), 30_000, `record (${l.stderr()})`);
    const enginePid = Number(
      execFileSync("ps", ["-o", "pid=", "--ppid", String(l.proc.pid)])
        .toString()
        .trim(),
    );
    process.kill(enginePid, "SIGSTOP");
    try {
      await waitUntil(() => !has(w, "sim-e"), 10_000, "deregistration of a hung engine");
    } finally {
      process.kill(enginePid, "SIGCONT");
    }
    await waitUntil(() => has(w, "sim-e"), 5000, "re-registration after recovery");
    l.proc.kill("SIGTERM");
    assert.equal(await l.exited, 0);
  });

  it("--discovery none runs the engine without registering; --dry-run prints JSON and exits 0", async () => {
    const w = await watcher("/lc4");
    const l = await launch("/lc4", "sim-d", ["--discovery", "none"]);
    await waitUntil(() => healthy(l.port), 30_000, "engine health");
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(has(w, "sim-d"), false);
    l.proc.kill("SIGINT");
    assert.equal(await l.exited, 0);

    const out = execFileSync(process.execPath, [
      INFERA_BIN,
      "engine",
      "vllm",
      "--model",
      "m",
      "--dry-run",
      "--engine-bin",
      "node /x/bin/infera-sim.js",
      "--",
      "--foo",
      "bar",
    ]).toString();
    const parsed = JSON.parse(out) as {
      argv: string[];
      env: Record<string, string>;
      record: { engine: string };
    };
    assert.deepEqual(parsed.argv.slice(0, 4), ["node", "/x/bin/infera-sim.js", "serve", "m"]);
    assert.deepEqual(parsed.argv.slice(-2), ["--foo", "bar"]);
    assert.equal(parsed.record.engine, "vllm");
  });

  it("a bad flag fails with a clear message and status 2", async () => {
    let status = 0;
    let stderr = "";
    try {
      execFileSync(
        process.execPath,
        [INFERA_BIN, "engine", "vllm", "--model", "m", "--role", "decode", "--connector", "sglang"],
        {
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
    } catch (err) {
      const e = err as { status: number; stderr: Buffer };
      status = e.status;
      stderr = e.stderr.toString();
    }
    assert.equal(status, 2);
    assert.match(stderr, /connector 'sglang' is not supported/);
  });
});
