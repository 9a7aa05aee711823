import assert from "node:assert/strict";
import { test } from "node:test";
import { flagsToConfig } from "../../src/cli/server.ts";

test("--kv-* flags become kv-aware policy options; --policy-option of the same key wins", () => {
  const cfg = flagsToConfig({
    policy: "kv-aware",
    kvOverlapWeight: "2",
    kvTemperature: "0.5",
    kvBalanceAbs: "8",
    kvBalanceRel: "2",
    policyOption: ["temperature=0.1", "decodeWeight=1"],
  });
  assert.deepEqual(cfg.policyOptions, {
    overlapWeight: 2,
    temperature: 0.1,
    balanceAbsThreshold: 8,
    balanceRelThreshold: 2,
    decodeWeight: 1,
  });
  assert.equal(flagsToConfig({}).policyOptions, undefined);
});
