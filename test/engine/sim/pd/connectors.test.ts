/**
 * The sim's PD connectors against a stand-in host: real side-channel sockets (HTTP, ZMQ),
 * each protocol's params, concurrent pulls, and the faults (unreachable P, timeouts,
 * expiry, block mismatch).
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { unpack } from "msgpackr";
import * as zmq from "zeromq";
import { createSimConnector } from "../../../../src/engine/sim/pd/index.ts";
import { parseMoriioRequestId, parseMoriioZmqAddress } from "../../../../src/engine/sim/pd/moriio.ts";
import { normalizeRooms } from "../../../../src/engine/sim/pd/sglang.ts";
import type { SimConnector } from "../../../../src/engine/sim/pd/types.ts";
import { InferaError } from "../../../../src/protocol/errors.ts";
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

// Shapes: vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py
// @ 0050936b22adda2ef0197fa3bb2551fe6c5437dc (`request_finished`) and nixl/metadata.py
// @ 02cfb534df5674737558730b10f23d1b7aef9b7c (`RemoteMeta.block_ids: BlockIds`, one list per KV cache group).
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
    assert.deepEqual(params.remote_block_ids, [[100, 101, 102, 103, 104, 105, 106]], "one list per KV group");
    assert.equal(params.remote_engine_id, "engine-p");
    assert.equal(params.remote_request_id, "req-1");
    assert.equal(params.remote_host, "127.0.0.1");
    assert.equal(params.remote_port, p.describe?.().bootstrapPort);
    assert.equal(params.tp_size, 1);
    assert.equal(params.remote_num_tokens, 100, "the prefill's computed tokens");
    assert.equal(params.dcp_size, 1);
    assert.equal(params.pp_size, 1);
    assert.equal(params.remote_blocks_expiry_time, null, "P exports no expiry (only a D does)");
    assert.equal(params.transfer_mode, "pull");
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
      d.pullForDecode(pdReq("a", tokens, { ...params, remote_block_ids: [[1, 2, 3]] }), signal()),
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

  test("D reads remote_block_ids per KV group: a flat list or non-integers fail the load (502), P keeps its blocks", async () => {
    const ph = new FakeKvHost("engine-p4");
    const p = await make("nixl", "prefill", ph, { side_channel_port: 0 });
    const d = await make("nixl", "decode", new FakeKvHost("engine-d4"));
    const tokens = prompt(40);
    const params = await p.onPrefillFinished(pdReq("g", tokens, {}), ph.hold("g", tokens));
    assert.ok(params);
    for (const bad of [[100, 101, 102], [["100"]], [[100], 7]]) {
      await assert.rejects(
        d.pullForDecode(pdReq("g", tokens, { ...params, remote_block_ids: bad }), signal()),
        (e) => {
          assert.equal(status(e), 502);
          assert.match(
            (e as Error).message,
            /remote_block_ids must be one list of block ids per KV cache group/,
          );
          return true;
        },
      );
    }
    assert.deepEqual(ph.released, [], "nothing was pulled");
    const pulled = await d.pullForDecode(pdReq("g", tokens, params), signal());
    assert.deepEqual(pulled.tokenIds, tokens, "the nested form P answered pulls");
  });

  test("D without remote_block_ids is an engine-side assertion (500); without remote_* keys the KV never comes (504)", async () => {
    const d = await make("nixl", "decode", new FakeKvHost("engine-d5"), { sim_pull_timeout_ms: 300 });
    const tokens = prompt(20);
    await assert.rejects(
      d.pullForDecode(pdReq("n1", tokens, { do_remote_prefill: true, remote_block_ids: null }), signal()),
      (e) => status(e) === 500 && /AssertionError/.test((e as Error).message),
    );
    const t0 = Date.now();
    await assert.rejects(
      d.pullForDecode(
        pdReq("n2", tokens, {
          do_remote_prefill: true,
          remote_block_ids: [[1]],
          remote_host: "127.0.0.1",
          remote_port: 1,
        }),
        signal(),
      ),
      (e) => {
        assert.equal(status(e), 504);
        assert.match((e as Error).message, /remote_engine_id, remote_request_id/);
        return true;
      },
    );
    assert.ok(Date.now() - t0 >= 250, "it waited: vLLM's request sits in WAITING_FOR_REMOTE_KVS");
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

// vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py
// @ 00f4240ee6458263d76cf51ca7901ce1350bb4d1 and mooncake/mooncake_utils.py
// @ e7ad92e5308e67c9657fc06f351ff4326848f130 (MooncakeBootstrapServer: POST /register, GET /query).
describe("mooncake", () => {
  test("GET /query answers dict[dp_rank, {engine_id, worker_addr: {tp: {pp: addr}}}]; D may ask before P finishes", async () => {
    const ph = new FakeKvHost("mc-p");
    const p = await make("mooncake", "prefill", ph, { bootstrap_port: 0 });
    const d = await make("mooncake", "decode", new FakeKvHost("mc-d"), { sim_pull_timeout_ms: 5000 });
    const port = p.describe?.().bootstrapPort;
    assert.ok(port);
    const q = (await (await fetch(`http://127.0.0.1:${port}/query`)).json()) as Record<string, unknown>;
    assert.deepEqual(Object.keys(q), ["0"]);
    const entry = q["0"] as { engine_id: string; worker_addr: Record<string, Record<string, string>> };
    assert.equal(entry.engine_id, "mc-p");
    assert.match(entry.worker_addr["0"]["0"], /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(Object.keys(q).includes("engine_id"), false, "no top-level engine_id");
    const tokens = prompt(64);
    const dParams = {
      do_remote_decode: false,
      do_remote_prefill: true,
      remote_bootstrap_addr: `http://127.0.0.1:${port}`,
      remote_engine_id: entry.engine_id,
      transfer_id: "xfer-1",
    };
    const pulling = d.pullForDecode(pdReq("r1", tokens, dParams), signal());
    await sleep(150);
    const pp = await p.onPrefillFinished(
      pdReq("r1", tokens, { do_remote_decode: true, transfer_id: "xfer-1" }),
      ph.hold("r1", tokens),
    );
    assert.equal(pp, null, "P answers no kv_transfer_params");
    const pulled = await pulling;
    assert.deepEqual(pulled.tokenIds, tokens);
    await sleep(50);
    assert.deepEqual(ph.released, ["r1"]);
  });

  test("POST /register: a second engine id for a dp rank or a taken (dp,tp,pp) slot is a 400; other ranks join /query", async () => {
    const p = await make("mooncake", "prefill", new FakeKvHost("mc-reg"), { bootstrap_port: 0 });
    const url = `http://127.0.0.1:${p.describe?.().bootstrapPort}`;
    const reg = (b: Record<string, unknown>) =>
      fetch(`${url}/register`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(b),
      });
    const ok = await reg({
      engine_id: "mc-reg_dp1",
      dp_rank: 1,
      tp_rank: 0,
      pp_rank: 0,
      addr: "tcp://10.0.0.2:7000",
    });
    assert.equal(ok.status, 200);
    assert.deepEqual(await ok.json(), { status: "ok" });
    const clash = await reg({ engine_id: "other", dp_rank: 1, tp_rank: 1, pp_rank: 0, addr: "tcp://x:1" });
    assert.equal(clash.status, 400);
    assert.match(((await clash.json()) as { detail: string }).detail, /Engine ID mismatch for dp_rank=1/);
    const dup = await reg({ engine_id: "mc-reg_dp1", dp_rank: 1, tp_rank: 0, pp_rank: 0, addr: "tcp://y:2" });
    assert.equal(dup.status, 400);
    assert.match(((await dup.json()) as { detail: string }).detail, /already registered/);
    const q = (await (await fetch(`${url}/query`)).json()) as Record<string, { engine_id: string }>;
    assert.deepEqual(Object.keys(q).sort(), ["0", "1"]);
    assert.equal(q["1"].engine_id, "mc-reg_dp1");
  });

  test("each DP rank is its own engine (<id>_dp<rank>); D pulling from an engine the bootstrap does not list fails (502)", async () => {
    const ph = new FakeKvHost("mc-dp", 64 * 1024, { dpSize: 2, dpRank: 1 });
    const p = await make("mooncake", "prefill", ph, { bootstrap_port: 0 });
    const d = await make("mooncake", "decode", new FakeKvHost("mc-dp-d"), { sim_pull_timeout_ms: 2000 });
    const url = `http://127.0.0.1:${p.describe?.().bootstrapPort}`;
    const q = (await (await fetch(`${url}/query`)).json()) as Record<string, { engine_id: string }>;
    assert.deepEqual(Object.keys(q), ["1"]);
    assert.equal(q["1"].engine_id, "mc-dp_dp1");
    const tokens = prompt(30);
    await p.onPrefillFinished(
      pdReq("r", tokens, { do_remote_decode: true, transfer_id: "t-dp" }),
      ph.hold("r", tokens),
    );
    const base = { do_remote_prefill: true, remote_bootstrap_addr: url, transfer_id: "t-dp" };
    await assert.rejects(
      d.pullForDecode(pdReq("r", tokens, { ...base, remote_engine_id: "mc-dp" }), signal()),
      (e) => {
        assert.equal(status(e), 502);
        assert.match((e as Error).message, /remote engine_id mc-dp not found from bootstrap server/);
        return true;
      },
    );
    const pulled = await d.pullForDecode(
      pdReq("r", tokens, { ...base, remote_engine_id: "mc-dp_dp1" }),
      signal(),
    );
    assert.deepEqual(pulled.tokenIds, tokens);
  });

  test("a second DP rank registers with bootstrap_server_address; D naming the rank that did not prefill fails, the right one pulls", async () => {
    const h0 = new FakeKvHost("mc-e", 64 * 1024, { dpSize: 2, dpRank: 0 });
    const h1 = new FakeKvHost("mc-e", 64 * 1024, { dpSize: 2, dpRank: 1 });
    const p0 = await make("mooncake", "prefill", h0, { bootstrap_port: 0 });
    const url = `http://127.0.0.1:${p0.describe?.().bootstrapPort}`;
    await make("mooncake", "prefill", h1, {
      bootstrap_server_address: `127.0.0.1:${p0.describe?.().bootstrapPort}`,
    });
    const q = (await (await fetch(`${url}/query`)).json()) as Record<string, { engine_id: string }>;
    assert.deepEqual(
      Object.entries(q).map(([k, v]) => [k, v.engine_id]),
      [
        ["0", "mc-e_dp0"],
        ["1", "mc-e_dp1"],
      ],
    );
    const d = await make("mooncake", "decode", new FakeKvHost("mc-e-d"), { sim_pull_timeout_ms: 400 });
    const tokens = prompt(24);
    await p0.onPrefillFinished(
      pdReq("e", tokens, { do_remote_decode: true, transfer_id: "t-e" }),
      h0.hold("e", tokens),
    );
    const base = { do_remote_prefill: true, remote_bootstrap_addr: url, transfer_id: "t-e" };
    await assert.rejects(
      d.pullForDecode(
        pdReq("e", tokens, { ...base, remote_engine_id: "mc-e_dp1", remote_dp_rank: 1 }),
        signal(),
      ),
      (e) => status(e) === 504 || status(e) === 502,
      "dp1 never prefilled t-e: no silent success",
    );
    const pulled = await d.pullForDecode(
      pdReq("e", tokens, { ...base, remote_engine_id: "mc-e_dp0" }),
      signal(),
    );
    assert.deepEqual(pulled.tokenIds, tokens);
  });

  test("P without transfer_id drops the KV silently (no error, blocks freed); a transfer P never offers times out on D (504)", async () => {
    const ph = new FakeKvHost("mc-p2");
    const p = await make("mooncake", "prefill", ph, { bootstrap_port: 0 });
    const d = await make("mooncake", "decode", new FakeKvHost("mc-d2"), { sim_pull_timeout_ms: 300 });
    const tokens = prompt(10);
    const noId = pdReq("x", tokens, { do_remote_decode: true });
    p.validate?.(noId, "prefill"); // vLLM only logs "Missing transfer_id in kv_transfer_params from router!"
    assert.equal(await p.onPrefillFinished(noId, ph.hold("x", tokens)), null);
    assert.deepEqual(ph.released, ["x"], "freed at once, nobody can pull it");
    const params = {
      do_remote_prefill: true,
      remote_bootstrap_addr: `http://127.0.0.1:${p.describe?.().bootstrapPort}`,
      remote_engine_id: "mc-p2",
      transfer_id: "never",
    };
    const t0 = Date.now();
    await assert.rejects(d.pullForDecode(pdReq("r", tokens, params), signal()), (e) => status(e) === 504);
    assert.ok(Date.now() - t0 < 10_000, "the configured 300 ms pull timeout, not the 30 s default");
    // D without remote_engine_id / transfer_id: vLLM never loads the KV; the request waits.
    const { remote_engine_id: _e, ...noEngine } = params;
    await assert.rejects(d.pullForDecode(pdReq("r2", tokens, noEngine), signal()), (e) => status(e) === 504);
  });
});

// vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_connector.py
// @ 0158326ccc22cff86725bbaa452df5e6be966c5c and moriio/moriio_common.py @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03.
describe("moriio", () => {
  async function proxy(): Promise<{ router: zmq.Router; port: number }> {
    const router = new zmq.Router();
    await router.bind("tcp://127.0.0.1:*");
    return { router, port: Number(router.lastEndpoint!.split(":").pop()) };
  }
  async function registrations(router: zmq.Router, n: number): Promise<Map<string, Record<string, unknown>>> {
    const seen = new Map<string, Record<string, unknown>>();
    while (seen.size < n) {
      const frames = await router.receive();
      const msg = unpack(frames[frames.length - 1]) as Record<string, unknown>;
      seen.set(String(msg.type), msg);
    }
    return seen;
  }

  test("registration: DEALER → proxy ROUTER, msgpack {type, http_address, zmq_address, dp_size, tp_size, transfer_mode}, WRITE by default", async () => {
    const { router, port } = await proxy();
    const base = { proxy_ip: "127.0.0.1", proxy_ping_port: port, handshake_port: 0, notify_port: 0 };
    const p = await make("moriio", "prefill", new FakeKvHost("mo-p0"), { ...base, http_port: 18001 });
    await make("moriio", "decode", new FakeKvHost("mo-d0"), { ...base, http_port: 18002, read_mode: "True" });
    const seen = await registrations(router, 2);
    router.close();
    const pReg = seen.get("P")!;
    assert.deepEqual(Object.keys(pReg).sort(), [
      "dp_size",
      "http_address",
      "tp_size",
      "transfer_mode",
      "type",
      "zmq_address",
    ]);
    assert.equal(pReg.http_address, "127.0.0.1:18001");
    assert.equal(pReg.transfer_mode, "WRITE", "read_mode defaults to false");
    assert.equal(pReg.dp_size, 1);
    assert.equal(pReg.tp_size, 1);
    assert.match(String(pReg.zmq_address), /^host:127\.0\.0\.1,handshake:\d+,notify:\d+$/);
    const addr = parseMoriioZmqAddress(String(pReg.zmq_address));
    assert.equal(addr?.handshakePort, p.describe?.().handshakePort);
    assert.equal(addr?.notifyPort, p.describe?.().notifyPort);
    assert.equal(seen.get("D")!.transfer_mode, "READ", 'read_mode "True" (any case) is READ');
  });

  test("a worker missing proxy_ip, proxy_ping_port or http_port refuses to start with KeyError naming the key", async () => {
    const full = {
      proxy_ip: "127.0.0.1",
      proxy_ping_port: 1,
      http_port: 18003,
      handshake_port: 0,
      notify_port: 0,
    };
    for (const key of ["proxy_ip", "proxy_ping_port", "http_port"] as const) {
      const { [key]: _gone, ...extra } = full;
      const c = createSimConnector(connectorOpts("moriio", "prefill", extra), new FakeKvHost(`mo-k-${key}`));
      assert.ok(c);
      await assert.rejects(c.start(), (e) => {
        assert.equal((e as Error).name, "KeyError");
        assert.equal((e as Error).message, `KeyError: '${key}'`);
        return true;
      });
      await c.close();
    }
  });

  test("READ: transfer_id on both sides (500 KeyError without), P echoes it; D reads from the handshake port and notifies P", async () => {
    const { router, port } = await proxy();
    const extra = {
      proxy_ip: "127.0.0.1",
      proxy_ping_port: port,
      handshake_port: 0,
      notify_port: 0,
      read_mode: true,
    };
    const ph = new FakeKvHost("mo-p");
    const p = await make("moriio", "prefill", ph, { ...extra, http_port: 18001 });
    const d = await make("moriio", "decode", new FakeKvHost("mo-d"), { ...extra, http_port: 18002 });
    const seen = await registrations(router, 2);
    router.close();
    const tokens = prompt(50);
    for (const [c, phase] of [
      [p, "prefill"],
      [d, "decode"],
    ] as const) {
      assert.throws(
        () =>
          c.validate?.(
            pdReq("m0", tokens, {
              do_remote_decode: phase === "prefill",
              do_remote_prefill: phase === "decode",
            }),
            phase,
          ),
        (e) => {
          assert.equal(status(e), 500);
          assert.match((e as Error).message, /KeyError: 'transfer_id'/);
          return true;
        },
      );
    }
    const params = await p.onPrefillFinished(
      pdReq("m1", tokens, { do_remote_decode: true, transfer_id: "tx-1" }),
      ph.hold("m1", tokens),
    );
    assert.ok(params);
    assert.deepEqual(Object.keys(params).sort(), [
      "do_remote_decode",
      "do_remote_prefill",
      "remote_block_ids",
      "remote_dp_size",
      "remote_engine_id",
      "remote_handshake_port",
      "remote_host",
      "remote_notify_port",
      "tp_size",
      "transfer_id",
    ]);
    assert.equal(params.transfer_id, "tx-1", "P echoes transfer_id");
    assert.equal(
      params.remote_engine_id,
      `127.0.0.1:${p.describe?.().handshakePort}`,
      "<host ip>:<handshake_port>",
    );
    assert.equal(params.remote_handshake_port, p.describe?.().handshakePort);
    assert.equal(params.remote_notify_port, p.describe?.().notifyPort);
    assert.deepEqual(params.remote_block_ids, [100, 101, 102, 103]);
    const pulled = await d.pullForDecode(pdReq("m1-d", tokens, params), signal());
    assert.equal(pulled.tokenIds.length, 50);
    for (let i = 0; i < 50 && ph.released.length === 0; i++) await sleep(20);
    assert.deepEqual(ph.released, ["m1"], "P frees on D's notify");

    // The router's request-id form carries the peers when the params do not.
    const rid = `___prefill_addr_${seen.get("P")!.zmq_address}___decode_addr_${seen.get("D")!.zmq_address}_${"ab".repeat(16)}`;
    assert.ok(parseMoriioRequestId(rid));
    await p.onPrefillFinished(pdReq(rid, tokens, { transfer_id: "tx-2" }), ph.hold(rid, tokens));
    const pulled2 = await d.pullForDecode(
      pdReq(rid, tokens, { do_remote_prefill: true, transfer_id: "tx-2" }),
      signal(),
    );
    assert.equal(pulled2.tokenIds.length, 50);
    // Neither params nor the id form: vLLM's ValueError, a 500.
    assert.throws(
      () => d.validate?.(pdReq("plain", tokens, { do_remote_prefill: true, transfer_id: "tx-3" }), "decode"),
      (e) => status(e) === 500 && /Cannot parse peer zmq_address/.test((e as Error).message),
    );
  });

  test("WRITE (default): P and D run at once; D announces its blocks on P's notify port, then gets the KV", async () => {
    const { router, port } = await proxy();
    const extra = { proxy_ip: "127.0.0.1", proxy_ping_port: port, handshake_port: 0, notify_port: 0 };
    const ph = new FakeKvHost("mo-wp");
    const p = await make("moriio", "prefill", ph, { ...extra, http_port: 18011 });
    const d = await make("moriio", "decode", new FakeKvHost("mo-wd"), {
      ...extra,
      http_port: 18012,
      sim_pull_timeout_ms: 5000,
    });
    router.close();
    const tokens = prompt(40);
    const pDesc = p.describe!();
    const dDesc = d.describe!();
    // What vLLM's toy proxy sends each half: P gets D's address, D gets P's.
    const toP = {
      do_remote_decode: true,
      transfer_id: "w-1",
      remote_host: "127.0.0.1",
      remote_port: 18012,
      remote_handshake_port: dDesc.handshakePort,
      remote_notify_port: dDesc.notifyPort,
      remote_engine_id: null,
      remote_block_ids: null,
    };
    const toD = {
      do_remote_prefill: true,
      transfer_id: "w-1",
      remote_host: "127.0.0.1",
      remote_port: 18011,
      remote_handshake_port: pDesc.handshakePort,
      remote_notify_port: pDesc.notifyPort,
      remote_engine_id: null,
      remote_block_ids: null,
    };
    p.validate?.(pdReq("w", tokens, toP), "prefill");
    assert.throws(
      () => p.validate?.(pdReq("w", tokens, { do_remote_decode: true, transfer_id: "w-0" }), "prefill"),
      (e) => status(e) === 500,
      "WRITE-mode P must know where D is",
    );
    const pulling = d.pullForDecode(pdReq("w-d", tokens, toD), signal());
    await sleep(150);
    const mo = p as unknown as { announced: Set<string> };
    assert.ok(mo.announced.has("w-1"), "D's remote_blocks notify reached P before P finished");
    const params = await p.onPrefillFinished(pdReq("w", tokens, toP), ph.hold("w", tokens));
    assert.equal(params?.transfer_id, "w-1");
    assert.deepEqual((await pulling).tokenIds, tokens);
    for (let i = 0; i < 50 && ph.released.length === 0; i++) await sleep(20);
    assert.deepEqual(ph.released, ["w"]);
  });
});

// sgl-project/sglang python/sglang/srt/disaggregation/common/conn.py @ 0094505da74125a31ceb354f37ae7a1b6a97d3f5
// (CommonKVBootstrapServer routes) and python/sglang/srt/managers/io_struct.py
// (GenerateReqInput._normalize_bootstrap_params: scalar room → room + i, list → list × n).
describe("sglang", () => {
  test("bootstrap fields mark the PD phase by role; D finds P's rank via GET /route and pulls the room while P computes", async () => {
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

  test("the bootstrap server answers SGLang's routes: /route PUT|GET (and 400/404/405/500), /register_dp_rank, /query_dp_ranks, /health", async () => {
    const p = await make("sglang", "prefill", new FakeKvHost("sg-b"), {}, { bootstrap_port: 0 });
    const base = `http://127.0.0.1:${p.describe?.().bootstrapPort}`;
    const json = { "content-type": "application/json" };
    const health = await fetch(`${base}/health`);
    assert.equal(health.status, 200);
    assert.equal(await health.text(), "OK");
    const missing = await fetch(`${base}/route?prefill_dp_rank=0`);
    assert.equal(missing.status, 400);
    assert.equal(await missing.text(), "Missing inputs for bootstrap server.");
    const info = (await (
      await fetch(`${base}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1`)
    ).json()) as Record<string, unknown>;
    for (const k of ["attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size", "kv_cache_dtype"])
      assert.ok(k in info, `PrefillServerInfo.${k}`);
    assert.equal(info.dp_size, 1);
    assert.equal(info.page_size, 16);
    assert.equal(info.follow_bootstrap_room, true);
    const rank = (await (
      await fetch(`${base}/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0`)
    ).json()) as Record<string, unknown>;
    assert.deepEqual(Object.keys(rank).sort(), ["rank_ip", "rank_port"]);
    assert.equal(rank.rank_ip, "127.0.0.1");
    const nope = await fetch(
      `${base}/route?prefill_dp_rank=3&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0`,
    );
    assert.equal(nope.status, 404);
    assert.match(await nope.text(), /Bootstrap info not found for dp_rank=3/);
    assert.equal((await fetch(`${base}/route`, { method: "DELETE" })).status, 405);
    const badPut = await fetch(`${base}/route`, {
      method: "PUT",
      headers: json,
      body: JSON.stringify({ rank_ip: "x" }),
    });
    assert.equal(badPut.status, 500, "a missing key is a KeyError in the handler");
    const reg = await fetch(`${base}/register_dp_rank`, {
      method: "POST",
      headers: json,
      body: JSON.stringify({ bootstrap_room: 77, dp_rank: 0 }),
    });
    assert.equal(await reg.text(), "OK");
    const q = await fetch(`${base}/query_dp_ranks`, {
      method: "POST",
      headers: json,
      body: JSON.stringify({ bootstrap_rooms: [77, 78] }),
    });
    assert.deepEqual(await q.json(), { "77": 0 });
  });

  test("batch rooms are normalized as SGLang does: scalar → room + i over prompts × n, a list repeats n times", () => {
    assert.deepEqual(normalizeRooms({ prompt: ["a", "b", "c"], bootstrap_room: 10 }), ["10", "11", "12"]);
    assert.deepEqual(normalizeRooms({ prompt: "a", n: 2, bootstrap_room: 10 }), ["10", "11"]);
    assert.deepEqual(normalizeRooms({ prompt: ["a", "b"], n: 2, bootstrap_room: [5, 9] }), [
      "5",
      "9",
      "5",
      "9",
    ]);
    assert.deepEqual(normalizeRooms({ prompt: [1, 2, 3], bootstrap_room: "9007199254740993" }), [
      "9007199254740993",
    ]);
    assert.deepEqual(normalizeRooms({ prompt: "a" }), []);
    assert.throws(
      () => normalizeRooms({ prompt: "a", bootstrap_room: "abc" }),
      (e) => status(e) === 400,
    );
    assert.throws(
      () => normalizeRooms({ prompt: "a", bootstrap_room: [1.5] }),
      (e) => status(e) === 400,
    );
  });

  test("a batch moves KV only when P and D agree on every item's room; an item whose room never arrives fails D (504)", async () => {
    const ph = new FakeKvHost("sg-bp");
    const p = await make("sglang", "prefill", ph, {}, { bootstrap_port: 0 });
    const d = await make("sglang", "decode", new FakeKvHost("sg-bd"), { sim_pull_timeout_ms: 400 });
    const port = p.describe?.().bootstrapPort;
    const tokens = prompt(20);
    const batch = (rooms: number[], id: string) => ({
      requestId: id,
      params: {},
      body: {
        prompt: ["x", "y"],
        bootstrap_host: ["127.0.0.1", "127.0.0.1"],
        bootstrap_port: [port, port],
        bootstrap_room: rooms,
      },
      promptTokenIds: tokens,
    });
    const ok = d.pullForDecode(batch([1001, 1002], "b1"), signal());
    await p.onPrefillFinished(batch([1001, 1002], "b1"), ph.hold("b1", tokens));
    assert.deepEqual((await ok).tokenIds, tokens);
    const bad = d.pullForDecode(batch([2001, 2002], "b2"), signal());
    await p.onPrefillFinished(batch([2001, 2999], "b2"), ph.hold("b2", tokens));
    await assert.rejects(bad, (e) => status(e) === 504);
  });
});

// ROCm/ATOM atom/kv_transfer/disaggregation/moriio/moriio_connector.py (scheduler `request_finished`),
// atom/entrypoints/openai/api_server.py (`/kv_transfer_info`), atom/kv_transfer/disaggregation/types.py
// (`_build_req_meta`) @ ffdf3bb5d.
describe("atom", () => {
  test("/kv_transfer_info has ATOM's four fields; P answers remote_port = its handshake port, an int transfer_id, first_token_id", async () => {
    const ph = new FakeKvHost("at-p");
    const p = await make("atom", "prefill", ph, {}, { handshake_port: 0 });
    const d = await make("atom", "decode", new FakeKvHost("at-d"));
    const info = p.httpRoutes?.()["/kv_transfer_info"]() as Record<string, unknown>;
    assert.deepEqual(Object.keys(info).sort(), ["dp_size", "handshake_port", "kv_role", "tp_size"]);
    assert.equal(info.kv_role, "kv_producer");
    assert.equal(info.handshake_port, p.describe?.().handshakePort);
    const tokens = prompt(20);
    const params = await p.onPrefillFinished(pdReq("t1", tokens, {}), ph.hold("t1", tokens));
    assert.ok(params);
    assert.equal(typeof params.transfer_id, "number", "ATOM's transfer id is the sequence id");
    assert.equal(params.first_token_id, 42);
    assert.equal(params.remote_port, p.describe?.().handshakePort, "not the HTTP port");
    assert.notEqual(params.remote_port, ph.httpPort);
    assert.equal(params.remote_handshake_port, info.handshake_port);
    assert.equal(params.dp_rank, 0);
    assert.deepEqual(params.draft_token_ids, []);
    // D reads remote_dp_size / remote_tp_size / remote_dp_rank with defaults: absent is fine.
    const pulled = await d.pullForDecode(pdReq("t1", tokens, params), signal());
    assert.deepEqual(pulled.tokenIds, tokens);
  });
});
