import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { parseSize } from "../../src/cli/server.ts";
import { configFromEnv, mergeConfig, resolveServerConfig } from "../../src/server/config.ts";

describe("config layers", () => {
  it("file < env < flags, field by field; workers imply static discovery", () => {
    const dir = mkdtempSync(join(tmpdir(), "infera-cfg-"));
    try {
      const file = join(dir, "c.yaml");
      writeFileSync(
        file,
        "port: 9001\npolicy: kv-aware\nmaxRetries: 5\ndiscovery:\n  workers: [http://127.0.0.1:1]\n",
      );
      const saved = { ...process.env };
      process.env.INFERA_PORT = "9002";
      process.env.INFERA_API_KEYS = "a, b";
      try {
        const c = resolveServerConfig({ port: 9003, policy: undefined }, file);
        assert.equal(c.port, 9003);
        assert.equal(c.policy, "kv-aware");
        assert.equal(c.maxRetries, 5);
        assert.deepEqual(c.apiKeys, ["a", "b"]);
        assert.equal(c.discovery.kind, "static");
        assert.equal(resolveServerConfig({}, file).port, 9002);
      } finally {
        process.env = saved;
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    assert.equal(mergeConfig({}).discovery.kind, "memory");
    assert.equal(
      mergeConfig({ discovery: { kind: "etcd" } }, { discovery: { workers: ["http://x:1"] } }).discovery.kind,
      "etcd",
    );
    assert.deepEqual(
      configFromEnv({ INFERA_ETCD: "http://e1:2379,http://e2:2379" }).discovery?.etcdEndpoints,
      ["http://e1:2379", "http://e2:2379"],
    );
    assert.throws(() => mergeConfig({ port: 70000 }));
    assert.equal(parseSize("4MiB"), 4 * 1024 * 1024);
    assert.equal(parseSize("512k"), 512 * 1024);
    assert.equal(parseSize("1000"), 1000);
  });
});
