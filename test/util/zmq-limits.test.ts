/**
 * libzmq's default context stops at 1023 sockets (ZMQ_MAX_SOCKETS, sized at the first socket:
 * zeromq/libzmq src/ctx.cpp @ 00e514e2c9b8ae0373a2b9d0e594310efd152fe5), which stopped a
 * server at 255 workers with KV events (3 sockets per worker + a DEALER per replay). Importing
 * the KV subscriber module raises it before any socket exists. This file runs in its own
 * process, so no socket was made before the import.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { context, Subscriber } from "zeromq";
import "../../src/kv/feeds/zmq.ts";

describe("zmq socket limit", () => {
  it("the KV subscriber's import lets a process hold more than libzmq's default 1023 sockets", () => {
    assert.ok(context.maxSockets > 4096, `maxSockets ${context.maxSockets}`);
    const socks: Subscriber[] = [];
    try {
      // 1,000 workers' SUB sockets and their monitors' PAIRs: 3,000 sockets.
      for (let i = 0; i < 3000; i++) socks.push(new Subscriber({ linger: 0 }));
      assert.equal(socks.length, 3000);
    } finally {
      for (const s of socks) s.close();
    }
  });
});
