/**
 * The sim's PD connectors against a stand-in host: real side-channel sockets (HTTP, ZMQ),
 * each protocol's params, concurrent pulls, and the faults (unreachable P, timeouts,
 * expiry, block mismatch).
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { unpack } from "msgpackr";
import * as zmq from "zeromq";
import { createSimConnector } from "../../../src/engine/sim/pd/index.ts";
import { parseMoriioRequestId, parseMoriioZmqAddress } from "../../../src/engine/sim/pd/moriio.ts";
import type { SimConnector } from "../../../src/engine/sim/pd/types.ts";
import { InferaError } from "../../../src/protocol/errors.ts";
import { connectorOpts, FakeKvHost, pdReq, prompt } from "./fake-host.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

const open: SimConnector[] = [];
after(async () => {
  for (const c of open) await c.close();
});

async function make(
  kind: Parameters<typeof connectorOpts>[0],
  role: "prefill" | "decode",
  host: FakeKvHost,
  extra: Record<string, unknown> = {},
  top: Record<string, unknown> = {},
): Promise<SimConnector> {
  const c = createSimConnector(connectorOpts(kind, role, extra, top), host);
  assert.ok(c);
  await c.start();
  open.push(c);
  return c;
}

const status = (err: unknown) => (err instanceof InferaError ? err.status : -1);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const signal = () => new AbortController().signal;

describe("nixl", () => {
  test("P answers the NIXL params; D pulls the named blocks; P frees them after the pull", async () => {
    const ph = new FakeKvHost("engine-p");
    const p = await make("nixl", "prefill", ph, { side_channel_port: 0 });
    const d = await make("nixl", "decode", new FakeKvHost("engine-d"));
    const tokens = prompt(100);
    const params = await p.onPrefillFinished(
      pdReq("req-1", tokens, { do_remote_decode: true }),
      ph.hold("req-1", tokens),
    );
    assert.ok(params);
    assert.equal(params.do_remote_prefill, true);
    assert.equal(params.do_remote_decode, false);
    assert.deepEqual(params.remote_block_ids, [100, 101, 102, 103, 104, 105, 106]);
    assert.equal(params.remote_engine_id, "engine-p");
    assert.equal(params.remote_request_id, "req-1");
    assert.equal(params.remote_host, "127.0.0.1");
    assert.equal(params.remote_port, p.describe?.().bootstrapPort);
    assert.equal(params.tp_size, 1);
    assert.equal(d.pdPhase?.({ kv_transfer_params: params }), "decode");
    const pulled = await d.pullForDecode(pdReq("req-1", tokens, params), signal());
    assert.deepEqual(pulled.tokenIds, tokens);
    assert.equal(pulled.bytes, 7 * 64 * 1024);
    await sleep(50);
    assert.deepEqual(ph.released, ["req-1"]);
  });

  test("wrong block ids, an unreachable P, and expiry are clean errors / releases", async () => {
    const ph = new FakeKvHost("engine-p2");
    const p = await make("nixl", "prefill", ph, { side_channel_port: 0, sim_hold_timeout_ms: 300 });
    const d = await make("nixl", "decode", new FakeKvHost("engine-d2"));
    const tokens = prompt(40);
    const params = await p.onPrefillFinished(pdReq("a", tokens, {}), ph.hold("a", tokens));
    assert.ok(params);
    await assert.rejects(
      d.pullForDecode(pdReq("a", tokens, { ...params, remote_block_ids: [1, 2, 3] }), signal()),
      (e) => {
        assert.equal(status(e), 502);
        return true;
      },
    );
    assert.deepEqual(ph.released, ["a"], "a failed pull frees P's blocks");
    const params2 = await p.onPrefillFinished(pdReq("b", tokens, {}), ph.hold("b", tokens));
    await sleep(500);
    assert.deepEqual(ph.released, ["a", "b"], "unpulled blocks expire");
    await assert.rejects(d.pullForDecode(pdReq("b", tokens, params2!), signal()), (e) => status(e) === 502);
    await p.close();
    await assert.rejects(d.pullForDecode(pdReq("b", tokens, params2!), signal()), (e) => {
      assert.equal(status(e), 502);
      assert.match((e as Error).message, /KV pull/);
      return true;
    });
  });

  test("the payload is capped at sim_max_transfer_bytes", async () => {
    const ph = new FakeKvHost("engine-p3", 1024 * 1024);
    const p = await make("nixl", "prefill", ph, {
      side_channel_port: 0,
      sim_max_transfer_bytes: 3 * 1024 * 1024,
    });
    const d = await make("nixl", "decode", new FakeKvHost("engine-d3"));
    const tokens = prompt(160);
    const params = await p.onPrefillFinished(pdReq("c", tokens, {}), ph.hold("c", tokens));
    const pulled = await d.pullForDecode(pdReq("c", tokens, params!), signal());
    assert.equal(pulled.bytes, 3 * 1024 * 1024);
  });
});

describe("mooncake", () => {
  test("bootstrap /query, transfer_id required, D may ask before P finishes", async () => {
    const ph = new FakeKvHost("mc-p");
    const p = await make("mooncake", "prefill", ph, { bootstrap_port: 0 });
    const d = await make("mooncake", "decode", new FakeKvHost("mc-d"), { sim_pull_timeout_ms: 5000 });
    const port = p.describe?.().bootstrapPort;
    assert.ok(port);
    const q = (await (await fetch(`http://127.0.0.1:${port}/query`)).json()) as Record<string, unknown>;
    assert.equal(q.engine_id, "mc-p");
    const tokens = prompt(64);
    assert.throws(
      () => p.validate?.(pdReq("x", tokens, { do_remote_decode: true }), "prefill"),
      (e) => status(e) === 400,
    );
    const dParams = {
      do_remote_decode: false,
      do_remote_prefill: true,
      remote_bootstrap_addr: `http://127.0.0.1:${port}`,
      remote_engine_id: q.engine_id,
      remote_dp_rank: 0,
      transfer_id: "xfer-1",
    };
    const pulling = d.pullForDecode(pdReq("r1", tokens, dParams), signal());
    await sleep(150);
    const pp = await p.onPrefillFinished(
      pdReq("r1", tokens, { do_remote_decode: true, transfer_id: "xfer-1" }),
      ph.hold("r1", tokens),
    );
    assert.equal(pp, null);
    const pulled = await pulling;
    assert.deepEqual(pulled.tokenIds, tokens);
    await sleep(50);
    assert.deepEqual(ph.released, ["r1"]);
  });

  test("a transfer P never offers times out on D with 504", async () => {
    const p = await make("mooncake", "prefill", new FakeKvHost("mc-p2"), { bootstrap_port: 0 });
    const d = await make("mooncake", "decode", new FakeKvHost("mc-d2"), { sim_pull_timeout_ms: 300 });
    const params = {
      do_remote_prefill: true,
      remote_bootstrap_addr: `http://127.0.0.1:${p.describe?.().bootstrapPort}`,
      transfer_id: "never",
    };
    const t0 = Date.now();
    await assert.rejects(d.pullForDecode(pdReq("r", prompt(10), params), signal()), (e) => status(e) === 504);
    assert.ok(Date.now() - t0 < 10_000, "the configured 300 ms pull timeout, not the 30 s default");
  });
});

describe("moriio", () => {
  test("P and D register with the proxy; D pulls via the handshake port and notifies P", async () => {
    const router = new zmq.Router();
    await router.bind("tcp://127.0.0.1:*");
    const proxyPort = Number(router.lastEndpoint!.split(":").pop());
    const extra = {
      proxy_ip: "127.0.0.1",
      proxy_ping_port: proxyPort,
      handshake_port: 0,
      notify_port: 0,
      read_mode: true,
    };
    const ph = new FakeKvHost("mo-p");
    const p = await make("moriio", "prefill", ph, { ...extra, http_port: 18001 });
    const d = await make("moriio", "decode", new FakeKvHost("mo-d"), { ...extra, http_port: 18002 });
    const seen = new Map<string, Record<string, unknown>>();
    while (seen.size < 2) {
      const frames = await router.receive();
      const msg = unpack(frames[frames.length - 1]) as Record<string, unknown>;
      seen.set(String(msg.type), msg);
    }
    router.close();
    const pReg = seen.get("P")!;
    assert.equal(pReg.http_address, "127.0.0.1:18001");
    assert.equal(pReg.transfer_mode, "READ");
    const addr = parseMoriioZmqAddress(String(pReg.zmq_address));
    assert.ok(addr);
    assert.equal(addr.handshakePort, p.describe?.().handshakePort);
    assert.equal(seen.get("D")!.http_address, "127.0.0.1:18002");

    const tokens = prompt(50);
    const params = await p.onPrefillFinished(pdReq("m1", tokens, {}), ph.hold("m1", tokens));
    assert.ok(params);
    assert.equal(params.remote_handshake_port, addr.handshakePort);
    assert.equal(params.remote_notify_port, addr.notifyPort);
    const pulled = await d.pullForDecode(pdReq("m1", tokens, params), signal());
    assert.equal(pulled.tokenIds.length, 50);
    for (let i = 0; i < 50 && ph.released.length === 0; i++) await sleep(20);
    assert.deepEqual(ph.released, ["m1"], "P frees on D's notify");

    // Newer form: the peers ride in the request id, D needs no address params.
    const rid = `___prefill_addr_${pReg.zmq_address}___decode_addr_${seen.get("D")!.zmq_address}_${"ab".repeat(16)}`;
    assert.ok(parseMoriioRequestId(rid));
    await p.onPrefillFinished(pdReq(rid, tokens, {}), ph.hold(rid, tokens));
    const pulled2 = await d.pullForDecode(pdReq(rid, tokens, { do_remote_prefill: true }), signal());
    assert.equal(pulled2.tokenIds.length, 50);
  });
});

describe("sglang", () => {
  test("bootstrap fields mark the PD phase by role; D pulls the room while P computes", async () => {
    const ph = new FakeKvHost("sg-p");
    const p = await make("sglang", "prefill", ph, {}, { bootstrap_port: 0 });
    const d = await make("sglang", "decode", new FakeKvHost("sg-d"));
    const port = p.describe?.().bootstrapPort;
    const body = { bootstrap_host: "127.0.0.1", bootstrap_port: port, bootstrap_room: 123456789012 };
    assert.equal(p.pdPhase?.(body), "prefill");
    assert.equal(d.pdPhase?.(body), "decode");
    assert.equal(d.pdPhase?.({}), null);
    const tokens = prompt(33);
    const req = { requestId: "s1", params: {}, body, promptTokenIds: tokens };
    const pulling = d.pullForDecode(req, signal());
    await sleep(100);
    await p.onPrefillFinished(req, ph.hold("s1", tokens));
    assert.deepEqual((await pulling).tokenIds, tokens);
  });
});

describe("atom", () => {
  test("/kv_transfer_info, relay params with transfer_id and first_token_id, pull", async () => {
    const ph = new FakeKvHost("at-p");
    const p = await make("atom", "prefill", ph, {}, { handshake_port: 0 });
    const d = await make("atom", "decode", new FakeKvHost("at-d"));
    const info = p.httpRoutes?.()["/kv_transfer_info"]() as Record<string, unknown>;
    assert.equal(info.tp_size, 1);
    assert.equal(info.dp_size, 1);
    assert.equal(info.kv_role, "kv_producer");
    const tokens = prompt(20);
    const params = await p.onPrefillFinished(pdReq("t1", tokens, {}), ph.hold("t1", tokens));
    assert.ok(params);
    assert.match(String(params.transfer_id), /^atom-/);
    assert.equal(params.first_token_id, 42);
    assert.equal(params.remote_handshake_port, info.handshake_port);
    const pulled = await d.pullForDecode(
      pdReq("t1", tokens, { ...params, remote_dp_size: 1, remote_tp_size: 1 }),
      signal(),
    );
    assert.deepEqual(pulled.tokenIds, tokens);
  });
});
