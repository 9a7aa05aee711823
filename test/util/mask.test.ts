/**
 * URL userinfo masking (issue #30 item 7): one helper for logs, --print-config, the dashboard
 * and the APIs, and the logger that applies it to every line.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { test } from "node:test";
import { maskUrlsDeep, maskUrlUserinfo } from "../../src/util/mask.ts";

test("the password in a URL's userinfo is masked; the user, host and path stay", () => {
  assert.equal(maskUrlUserinfo("nats://infera:s3cret@nats:4222"), "nats://infera:***@nats:4222");
  assert.equal(maskUrlUserinfo("http://u:p%40ss@10.0.0.1:8000/v1"), "http://u:***@10.0.0.1:8000/v1");
  // A lone token (NATS takes one as userinfo) is all secret.
  assert.equal(maskUrlUserinfo("nats://tok3n@h:4222"), "nats://***@h:4222");
  // Lists, and URLs inside text.
  assert.equal(
    maskUrlUserinfo("nats://a:b@h1:4222,nats://c:d@h2:4222"),
    "nats://a:***@h1:4222,nats://c:***@h2:4222",
  );
  assert.equal(maskUrlUserinfo("connect http://x:y@h failed"), "connect http://x:***@h failed");
  // Nothing to mask: unchanged (an @ in a path or a mail address is not userinfo).
  for (const s of ["http://h:8000/a@b", "user@example.com", "http://h:8000", ""])
    assert.equal(maskUrlUserinfo(s), s);
});

test("maskUrlsDeep masks strings in nested records and copies only what changed", () => {
  const rec = { id: "w", url: "http://u:pw@h:1", labels: { a: "x" }, list: ["nats://t@h"] };
  const out = maskUrlsDeep(rec);
  assert.deepEqual(out, { id: "w", url: "http://u:***@h:1", labels: { a: "x" }, list: ["nats://***@h"] });
  assert.equal(rec.url, "http://u:pw@h:1", "the input is not modified");
  assert.equal(out.labels, rec.labels, "unchanged parts are shared");
  const clean = { a: 1, b: ["x"] };
  assert.equal(maskUrlsDeep(clean), clean);
});

test("every log line has URL credentials masked, in fields, bindings and the message", () => {
  const code = `
    import { createLogger } from "./src/util/log.ts";
    const log = createLogger("t", { etcd: "http://root:bind-secret@e:2379" });
    log.info({ url: "http://u:field-secret@h:8000", endpoints: ["http://a:list-secret@e"] }, "hello");
    log.child({ nats: "nats://s:child-secret@n:4222" }).warn("via nats://m:msg-secret@n:4222");
  `;
  const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], {
    encoding: "utf8",
    env: { ...process.env, INFERA_LOG_LEVEL: "info" },
  });
  assert.equal(r.status, 0, r.stderr);
  const lines = r.stdout.trim().split("\n");
  assert.equal(lines.length, 2, r.stdout);
  for (const s of ["bind-secret", "field-secret", "list-secret", "child-secret", "msg-secret"])
    assert.ok(!r.stdout.includes(s), `${s} logged: ${r.stdout}`);
  assert.match(lines[0]!, /"url":"http:\/\/u:\*\*\*@h:8000"/);
  assert.match(lines[1]!, /"msg":"via nats:\/\/m:\*\*\*@n:4222"/);
});
