/**
 * `infera kvd --remote`: a Redis URL with a password must not travel on argv (readable by every
 * user of the host through ps and /proc/PID/cmdline). It comes from INFERA_KVD_REMOTE_URL or
 * --remote-file; on the command line it is refused, and the refusal shows it masked.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { test } from "node:test";
import { resolveKvdRemote } from "../../src/cli/kvd.ts";

const noFile = (p: string): string => {
  throw new Error(`unexpected read of ${p}`);
};

test("a URL with a password on argv is refused, masked in the message", () => {
  assert.throws(
    () => resolveKvdRemote({ remote: "redis://default:s3cret@redis:6379/0" }, "cli", noFile),
    (e: Error) => /INFERA_KVD_REMOTE_URL/.test(e.message) && !e.message.includes("s3cret"),
  );
  // Redis' password-only form (no user) too.
  assert.throws(() => resolveKvdRemote({ remote: "redis://:s3cret@redis:6379/0" }, "cli", noFile));
});

test("the same URL from the environment or a file is taken; a plain URL on argv still is", () => {
  const url = "redis://default:s3cret@redis:6379/0";
  assert.equal(resolveKvdRemote({ remote: url }, "env", noFile), url);
  assert.equal(
    resolveKvdRemote({ remoteFile: "/run/secrets/url" }, undefined, () => `${url}\n`),
    url,
  );
  assert.equal(resolveKvdRemote({ remote: "redis://redis:6379/0" }, "cli", noFile), "redis://redis:6379/0");
  assert.equal(resolveKvdRemote({}, undefined, noFile), undefined);
  assert.throws(
    () => resolveKvdRemote({ remote: "redis://r:6379", remoteFile: "/x" }, "cli", noFile),
    /exclusive/,
  );
});

test("the real CLI refuses the password on argv before starting anything", () => {
  const r = spawnSync(
    process.execPath,
    [
      "bin/infera.js",
      "kvd",
      "--socket",
      "/nonexistent/kvd.sock",
      "--remote",
      "redis://u:s3cret@127.0.0.1:1/0",
    ],
    { encoding: "utf8", timeout: 20_000, env: { ...process.env, INFERA_KVD_REMOTE_URL: "" } },
  );
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /carries a password on the command line/);
  assert.ok(!r.stderr.includes("s3cret"), r.stderr);
});
