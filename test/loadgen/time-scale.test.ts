/**
 * `infera bench --time-scale F` replays a trace's arrivals F× faster, keeping its own gaps
 * (issue #28 item 5): the CLI against a spawned sim, with the send times read back from the
 * --output JSON. The trace is Mooncake's shape: `timestamp` in ms from the trace start
 * (kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl @ a2a4b18a).
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { BenchResult } from "../../src/loadgen/schema.ts";
import { INFERA_BIN } from "../helpers/infera.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";

describe("infera bench --time-scale", () => {
  let sim: SimProcess;
  let dir: string;
  before(async () => {
    sim = await startSim({ args: ["--speed", "50"] });
    dir = mkdtempSync(join(tmpdir(), "bench-time-scale-"));
  });
  after(async () => {
    await sim?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const bench = (trace: string, out: string, ...extra: string[]) =>
    spawnSync(
      process.execPath,
      [
        INFERA_BIN,
        "bench",
        "--url",
        sim.url,
        "--model",
        sim.model,
        "--workload",
        trace,
        "--max-tokens",
        "2",
        "--quiet",
        "--output",
        out,
        ...extra,
      ],
      { encoding: "utf8", timeout: 60_000 },
    );

  it("divides every gap of the trace by F (F = 4: 0, 1.2, 2.0 s become 0, 0.3, 0.5 s)", () => {
    const trace = join(dir, "t.jsonl");
    // Absolute timestamps that do not start at 0: the first line is the run's start.
    writeFileSync(
      trace,
      [5000, 6200, 7000]
        .map((t, i) => JSON.stringify({ timestamp: t, input_length: 40, output_length: 2, hash_ids: [i] }))
        .join("\n"),
    );
    const starts = (f: string | null) => {
      const out = join(dir, `r-${f}.json`);
      const r = bench(trace, out, ...(f ? ["--time-scale", f] : []));
      assert.equal(r.status, 0, r.stderr);
      const res = JSON.parse(readFileSync(out, "utf8")) as BenchResult;
      assert.equal(res.summary.requests.ok, 3);
      assert.equal(res.config.time_scale, f ? Number(f) : 1);
      return res.requests.map((x) => x.start_ms);
    };
    const scaled = starts("4");
    // Each send is due at t/F; timers fire late, never early, and by a little on a busy box.
    for (const [i, due] of [0, 300, 500].entries()) {
      assert.ok(scaled[i] >= due - 1, `request ${i} sent at ${scaled[i]} ms, due ${due}`);
      assert.ok(scaled[i] < due + 150, `request ${i} sent at ${scaled[i]} ms, due ${due}`);
    }
    const plain = starts(null);
    assert.ok(plain[2] >= 1999, `unscaled last send at ${plain[2]} ms`);
  });

  it("refuses a time scale that is not a number > 0 (exit 2)", () => {
    const trace = join(dir, "one.jsonl");
    writeFileSync(trace, JSON.stringify({ timestamp: 0, prompt: "hi", max_tokens: 2 }));
    for (const bad of ["0", "-1", "fast"]) {
      const r = bench(trace, join(dir, "bad.json"), "--time-scale", bad);
      assert.equal(r.status, 2, `--time-scale ${bad}: ${r.stderr}`);
      assert.match(r.stderr, /--time-scale/);
    }
  });
});
