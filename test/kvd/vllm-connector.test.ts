import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { KvdDaemon } from "../../src/kvd/daemon.ts";
import { MiB, REPO_ROOT as ROOT, runPython, startTestKvd, tempDir } from "./helpers.ts";

// The contract comes from vLLM's own source, reproduced in test/kvd/py/fake_vllm:
// vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/base.py @ 003df2961dd8830c317a61f9745ccd557da9fa06
// vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/factory.py @ a4cd9d0d28bdb41db8dfe0acdafac2bf2f608630
//   (and its later revision that refuses a 2-argument constructor with a ValueError)
// vllm-project/vllm vllm/utils/func_utils.py @ 01e4fce07423dafcc832600ba05159fb28dc1126 (supports_kw)
describe("InferaKvdConnector loads as vLLM loads an external v1 connector", () => {
  const tmp = tempDir();
  let kvd: KvdDaemon;
  before(async () => {
    kvd = await startTestKvd(tmp.dir, { ramBytes: 8 * MiB });
  });
  after(async () => {
    await kvd.close();
    tmp.cleanup();
  });

  it("passes the factory's constructor check, keeps its role and implements every abstract method", async () => {
    const r = await runPython([
      join(ROOT, "test/kvd/py/vllm_contract_check.py"),
      kvd.socketPath!,
      join(ROOT, "python"),
    ]);
    assert.equal(r.code, 0, r.stderr);
    const out = JSON.parse(r.stdout.trim().split("\n").pop()!) as {
      class_check: string;
      have_vllm: boolean;
      subclass: boolean;
      abstract_left: string[];
      abstract_in_base: string[];
      roles: Record<string, { role?: string; kv_cache_config_kept?: boolean; error?: string }>;
      methods: Record<string, string>;
      old_refused: boolean;
    };
    assert.equal(out.class_check, "ok", "factory accepts a class whose __init__ takes kv_cache_config");
    assert.equal(out.have_vllm, true, "the connector picked up (the stand-in of) vLLM's base class");
    assert.equal(out.subclass, true);
    assert.deepEqual(out.abstract_left, []);
    for (const role of ["SCHEDULER", "WORKER"]) {
      assert.deepEqual(out.roles[role], { role, kv_cache_config_kept: true }, `constructed as ${role}`);
    }
    // Every abstract method of vLLM's base is implemented with a compatible signature.
    assert.deepEqual(out.abstract_in_base, [
      "build_connector_meta",
      "get_num_new_matched_tokens",
      "save_kv_layer",
      "start_load_kv",
      "update_state_after_alloc",
      "wait_for_layer_load",
      "wait_for_save",
    ]);
    for (const m of out.abstract_in_base) assert.equal(out.methods[m], "ok", `${m}: ${out.methods[m]}`);
    for (const [m, v] of Object.entries(out.methods)) assert.equal(v, "ok", `override ${m}: ${v}`);
    assert.equal(out.old_refused, true, "the stand-in factory refuses a 2-argument connector");
  });
});
