/**
 * The server's limits and time limits (issue #17 item 4) in every config layer: file, INFERA_*
 * environment and flags (flags win), with gateway defaults; and that a configured upstream
 * limit is what the running server uses.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { Command } from "commander";
import { flagsToConfig, registerServer } from "../../src/cli/server.ts";
import { configFromEnv, defaultServerConfig, mergeConfig } from "../../src/server/config.ts";

describe("limits and time limits: file < env < flags", () => {
  it("defaults are explicit", () => {
    const c = mergeConfig();
    assert.equal(c.requestTimeoutMs, 60_000);
    assert.equal(c.upstream.headersTimeoutMs, 600_000);
    assert.equal(c.upstream.bodyTimeoutMs, 300_000);
    assert.equal(c.maxResponseBufferBytes, 16 * 1024 * 1024);
    assert.equal(c.metricsPublic, false);
    assert.deepEqual(defaultServerConfig.upstream, { headersTimeoutMs: 600_000, bodyTimeoutMs: 300_000 });
  });

  it("environment", () => {
    const e = configFromEnv({
      INFERA_REQUEST_TIMEOUT_MS: "5000",
      INFERA_UPSTREAM_HEADERS_TIMEOUT_MS: "7000",
      INFERA_UPSTREAM_BODY_TIMEOUT_MS: "8000",
      INFERA_MAX_RESPONSE_BUFFER_BYTES: "1048576",
      INFERA_METRICS_PUBLIC: "1",
    });
    const c = mergeConfig(e);
    assert.equal(c.requestTimeoutMs, 5000);
    assert.equal(c.upstream.headersTimeoutMs, 7000);
    assert.equal(c.upstream.bodyTimeoutMs, 8000);
    assert.equal(c.maxResponseBufferBytes, 1048576);
    assert.equal(c.metricsPublic, true);
    // Unset variables leave the defaults (and other layers) alone.
    assert.equal(mergeConfig(configFromEnv({})).upstream.bodyTimeoutMs, 300_000);
  });

  it("flags win over the environment, which wins over the file", async () => {
    const program = new Command().exitOverride();
    let seen: Record<string, unknown> = {};
    registerServer(program);
    const server = program.commands.find((c) => c.name() === "server")!;
    server.action((flags: Record<string, unknown>) => {
      seen = flags;
    });
    await program.parseAsync(
      [
        "server",
        "--request-timeout",
        "2500",
        "--upstream-headers-timeout",
        "3000",
        "--upstream-body-timeout",
        "4000",
        "--max-response-buffer",
        "2MiB",
        "--metrics-public",
      ],
      { from: "user" },
    );
    const flags = flagsToConfig(seen);
    const dir = mkdtempSync(join(tmpdir(), "infera-limits-"));
    try {
      const file = join(dir, "c.json");
      writeFileSync(
        file,
        JSON.stringify({ requestTimeoutMs: 1, upstream: { headersTimeoutMs: 2, bodyTimeoutMs: 3 } }),
      );
      const { configFromFile } = await import("../../src/server/config.ts");
      const env = configFromEnv({ INFERA_UPSTREAM_BODY_TIMEOUT_MS: "9000" });
      const fileOnly = mergeConfig(configFromFile(file));
      assert.equal(fileOnly.upstream.bodyTimeoutMs, 3);
      assert.equal(mergeConfig(configFromFile(file), env).upstream.bodyTimeoutMs, 9000);
      const c = mergeConfig(configFromFile(file), env, flags);
      assert.equal(c.requestTimeoutMs, 2500);
      assert.equal(c.upstream.headersTimeoutMs, 3000);
      assert.equal(c.upstream.bodyTimeoutMs, 4000);
      assert.equal(c.maxResponseBufferBytes, 2 * 1024 * 1024);
      assert.equal(c.metricsPublic, true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("invalid values are refused at start", () => {
    assert.throws(() => mergeConfig({ requestTimeoutMs: -1 }), /request timeout/);
    assert.throws(() => mergeConfig({ maxResponseBufferBytes: 0 }), /response buffer/);
    assert.throws(() => mergeConfig({ upstream: { bodyTimeoutMs: Number.NaN } }), /body timeout/);
  });
});
