/**
 * D's side-channel pull (src/engine/sim/pd/pull-client.ts): which typed error each way a pull
 * ends in. A waiting pull that P answers 404 `kv_not_found` (P waited out `wait_ms` and the
 * KV never came) is the pull timing out, 504 like D's own timer, not a 502: which of the two
 * timers fires first is up to the scheduler, and on a loaded machine the test of a batch room
 * P never fills (test/engine/sim/pd-sglang-e2e.test.ts) got 502 where SGLang's wait ends in
 * a time-out.
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { pullKv, sideChannelUrl } from "../../../../src/engine/sim/pd/pull-client.ts";
import { TimeoutError, UpstreamError } from "../../../../src/protocol/errors.ts";

describe("pullKv error mapping", () => {
  let server: http.Server;
  let port: number;
  before(async () => {
    // Answers at once, the way P's side channel answers when its wait has run out.
    server = http.createServer((req, res) => {
      const notHeld = req.url?.includes("/kv/missing");
      const status = notHeld ? 404 : 409;
      const code = notHeld ? "kv_not_found" : "kv_blocks_mismatch";
      const body = JSON.stringify({
        error: { message: `answer ${status}`, type: "invalid_request_error", code },
      });
      res.writeHead(status, { "content-type": "application/json" }).end(body);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    port = (server.address() as AddressInfo).port;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  /** What a pull of `key` (waiting `waitMs` when given) is rejected with. */
  const pullError = (key: string, waitMs?: number): Promise<unknown> =>
    pullKv(sideChannelUrl("127.0.0.1", port, key), {
      signal: new AbortController().signal,
      timeoutMs: 10_000,
      ...(waitMs !== undefined ? { waitMs } : {}),
    }).then(
      () => assert.fail("the pull succeeded"),
      (e: unknown) => e,
    );

  test("a waiting pull answered kv_not_found times out (504)", async () => {
    const err = await pullError("missing", 1500);
    assert.ok(err instanceof TimeoutError, String(err));
    assert.equal(err.status, 504);
  });

  test("a pull that does not wait, answered kv_not_found, fails (502)", async () => {
    const err = await pullError("missing");
    assert.ok(err instanceof UpstreamError, String(err));
    assert.equal(err.status, 502);
  });

  test("a waiting pull answered another error still fails (502)", async () => {
    const err = await pullError("other", 1500);
    assert.ok(err instanceof UpstreamError, String(err));
    assert.equal(err.status, 502);
  });
});
