/**
 * `infera up --workers N` runs its N workers as one `infera-sim --fleet N` process: N workers
 * in discovery (own URL, own KV-event endpoint), one pid, and stopping the cluster ends it.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { startLocalCluster } from "../../../src/server/local-cluster.ts";
import { freePort } from "../../helpers/ports.ts";
import { parseMetric } from "../../helpers/sim.ts";

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("infera up over a fleet", () => {
  it("N workers, one fleet process; round-robin reaches every engine; stop ends the fleet", async () => {
    const lines: string[] = [];
    const cluster = await startLocalCluster({
      workers: 3,
      model: "sim-model",
      policy: "round-robin",
      port: await freePort(),
      host: "127.0.0.1",
      speed: 50,
      simArgs: [],
      apiKeys: [],
      progress: (l) => lines.push(l),
      handleSignals: false,
    });
    let pid = 0;
    try {
      const pids = new Set(cluster.sims.map((s) => s.proc.pid));
      assert.equal(pids.size, 1, "one process for all workers");
      pid = cluster.sims[0].proc.pid!;
      assert.ok(alive(pid));
      assert.ok(
        lines.some((l) => l.includes("worker 3/3 ready")),
        lines.join("\n"),
      );
      const workers = (await (await fetch(`${cluster.server.url}/v1/workers`)).json()) as {
        data: { id: string; url: string; labels: { pid: string }; kvEvents: { endpoint: string } }[];
      };
      assert.equal(workers.data.length, 3);
      assert.equal(new Set(workers.data.map((w) => w.url)).size, 3);
      assert.equal(new Set(workers.data.map((w) => w.kvEvents.endpoint)).size, 3);
      assert.ok(workers.data.every((w) => w.labels.pid === String(pid)));
      for (let k = 0; k < 6; k++) {
        const r = await fetch(`${cluster.server.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "sim-model", prompt: `hello ${k}`, max_tokens: 2 }),
        });
        assert.equal(r.status, 200, await r.text());
      }
      for (const s of cluster.sims) {
        const t = await (await fetch(`${s.url}/metrics`)).text();
        assert.equal(parseMetric(t, "vllm:generation_tokens_total"), 4, `${s.url} served two requests`);
      }
    } finally {
      await cluster.stop();
    }
    assert.equal(alive(pid), false, "the fleet process is gone");
  });
});
