import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { KvdDaemon } from "../../src/kvd/daemon.ts";
import { MiB, REPO_ROOT as ROOT, runPython, startTestKvd, tempDir } from "./helpers.ts";

describe("python client (stdlib) against the real daemon", () => {
  const tmp = tempDir();
  let kvd: KvdDaemon;
  before(async () => {
    kvd = await startTestKvd(tmp.dir, { ramBytes: 16 * MiB });
  });
  after(async () => {
    await kvd.close();
    tmp.cleanup();
  });

  it("receives the fd, maps the arena, PUT/GET/LOOKUP/RELEASE, and the connector's scheduler side works", async () => {
    const r = await runPython([
      join(ROOT, "test/kvd/py/client_check.py"),
      kvd.socketPath!,
      join(ROOT, "python"),
    ]);
    assert.equal(r.code, 0, r.stderr);
    const out = JSON.parse(r.stdout.trim().split("\n").pop()!);
    assert.equal(out.arena_bytes, 16 * MiB);
    assert.deepEqual(out.put, [true, false], "retention none is not stored");
    assert.deepEqual(out.put_arena, [true]);
    assert.equal(out.zero_copy, true, "GET answered a view of the Python process's own mmap");
    assert.equal(out.a_ok, true);
    assert.equal(out.b_ok, true);
    assert.equal(out.missing, true);
    assert.equal(out.copy_sees_mapping_write, true, "shared pages across processes");
    assert.equal(out.released, 2);
    assert.equal(out.lookup, 2);
    assert.deepEqual(out.exists, ["l2", null]);
    assert.equal(out.ns_forbidden, true);
    assert.equal(out.n_keys, 3);
    assert.equal(out.matched_before, 0);
    assert.equal(out.matched_after, 64);
    assert.equal(out.matched_after_computed, 48);
    assert.deepEqual(out.meta, {
      load_chunks: 2,
      store: true,
      retention: "short",
      blocks: [0, 1, 2, 3, 4, 5, 6],
      store_until: 3,
    });
    assert.equal(out.store_until_partial, 1, "only chunks computed in this step are saved");
    assert.equal(out.none_store, false);
    assert.deepEqual(out.request_finished, [false, null]);
    assert.deepEqual(out.get_finished, [null, null]);
    // The daemon saw the Python PUT land with retention short.
    const st = kvd.store.stats() as { tiers: { l2: { chunks: number } } };
    assert.ok(st.tiers.l2.chunks >= 4);
  });

  it("the connector's worker side saves every layer and another worker loads it into its own blocks", async (t) => {
    const probe = await runPython(["-c", "import numpy"]);
    if (probe.code !== 0) {
      t.skip("numpy not installed (the test's torch stand-in needs it)");
      return;
    }
    const r = await runPython([
      join(ROOT, "test/kvd/py/worker_check.py"),
      kvd.socketPath!,
      join(ROOT, "python"),
    ]);
    assert.equal(r.code, 0, r.stderr);
    const out = JSON.parse(r.stdout.trim().split("\n").pop()!);
    assert.equal(out.matched_cold, 0);
    assert.equal(out.matched_warm, 96, "3 chunks of 32 tokens (the last prompt token is always computed)");
    assert.equal(out.load_chunks, 3);
    assert.equal(out.loaded_equal, true, "KV bytes arrived in worker B's blocks, other blocks untouched");
    assert.equal(out.none_matched_after, 0, "infera_retention none saved nothing");
    assert.ok(out.stats_l2_chunks >= 9, "3 chunks × 2 layers + 3 markers");
    assert.equal(out.matched_after_layer_loss, 32, "only the chunk before the missing layer counts");
  });

  it("the connector module imports without vLLM", async () => {
    const r = await runPython([
      "-c",
      `import sys; sys.path.insert(0, ${JSON.stringify(join(ROOT, "python"))}); import infera_kvd; from infera_kvd import InferaKvdConnector; print(InferaKvdConnector.__mro__[1].__name__)`,
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /object|KVConnectorBase_V1/);
  });
});
