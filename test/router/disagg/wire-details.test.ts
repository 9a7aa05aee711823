/**
 * Issue #16's wire details of the PD protocols, each pinned to the engine source that defines
 * it (the DisaggRouter against a scripted executor, real HTTP for Mooncake's bootstrap GET):
 *
 * - MoRIIO: one `transfer_id` (`tx-<uuid>`) on both halves; READ (serial) and WRITE
 *   (concurrent) bodies; mode from the worker's registration; pairing within one mode.
 * - Mooncake with several DP ranks behind P's URL: the request pinned to a rank with
 *   `X-data-parallel-rank`, D given that rank's engine id from `/query`.
 * - SGLang batched requests: per-item bootstrap lists.
 */
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";
import { parseMoriioRegistration } from "../../../src/discovery/moriio-proxy.ts";
import type { ConnectorInfo, WorkerRecord } from "../../../src/discovery/types.ts";
import { pdProtocols } from "../../../src/router/disagg/protocols/index.ts";
import { engineIdFromQuery } from "../../../src/router/disagg/protocols/mooncake.ts";
import { type Call, delay, FakeExecutor, jsonAnswer } from "./fake-exec.ts";
import { firstPairRouter, record, routingRequest, state } from "./fixtures.ts";

const router = firstPairRouter;

const body = { model: "m", messages: [{ role: "user", content: "hi" }], stream: true, max_tokens: 20 };
const kvp = (c: Call) => c.body.kv_transfer_params as Record<string, unknown>;
const signal = () => new AbortController().signal;
const drain = async (it: AsyncIterable<Uint8Array>) => {
  for await (const _ of it) {
    // read to the end
  }
};
const TX_ID = /^tx-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

const moriio = (
  over: Partial<ConnectorInfo> & { handshakePort: number; notifyPort: number },
): ConnectorInfo => ({
  kind: "moriio",
  ...over,
});
const moriioP = (mode?: "READ" | "WRITE", over: Partial<WorkerRecord> = {}) =>
  record(
    "p1",
    "prefill",
    moriio({ bootstrapHost: "10.1.1.1", handshakePort: 6301, notifyPort: 61005, transferMode: mode }),
    { url: "http://10.1.1.1:8100", dpSize: 1, tpSize: 8, ...over },
  );
const moriioD = (mode?: "READ" | "WRITE") =>
  record(
    "d1",
    "decode",
    moriio({ bootstrapHost: "10.2.2.2", handshakePort: 6302, notifyPort: 61006, transferMode: mode }),
    { url: "http://10.2.2.2:8200", dpSize: 2, tpSize: 4 },
  );

// vllm-project/router src/routers/http/moriio_pd_router.rs @ a9e5c5280ab38277ba788f9e6efb3c2fdb0a9515:
// `transfer_id = format!("tx-{}", Uuid::new_v4())`, the same on both halves;
// build_prefill_kv_params gives P D's host, HTTP port, handshake/notify ports, dp/tp sizes and
// null engine/block ids; build_decode_kv_params gives D P's, plus remote_dp_rank when P's
// dp_size > 1; READ awaits P and copies its remote_engine_id / remote_block_ids, WRITE fires
// both at once with them null. Current vLLM reads the id unconditionally on both sides
// (MoRIIOConnectorScheduler.update_state_after_alloc: `transfer_id = params["transfer_id"]`),
// and older MoRIIO ReqMeta reads `remote_port` without a default
// (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_common.py
// @ 42fa4c096d406754b7e5c6d93835fe390487c8af, MoRIIOConnectorMetadata.add_new_req).
describe("MoRIIO transfer_id and transfer modes (issue #16)", () => {
  const prefillAddress = {
    do_remote_decode: true,
    do_remote_prefill: false,
    remote_engine_id: null,
    remote_block_ids: null,
    remote_host: "10.2.2.2",
    remote_port: 8200,
    remote_handshake_port: 6302,
    remote_notify_port: 61006,
    remote_dp_size: 2,
    remote_tp_size: 4,
  };

  test("READ: serial; both halves carry one tx-<uuid>; P gets D's address, D P's and P's block ids", async () => {
    const answer = {
      do_remote_prefill: true,
      remote_engine_id: "10.1.1.1:6301",
      remote_block_ids: [[4, 5, 6]],
      remote_request_id: "r",
    };
    let pDoneAt = 0;
    const exec = new FakeExecutor({
      p1: async (c) => {
        await delay(20, c.opts.signal);
        pDoneAt = performance.now();
        return jsonAnswer(200, { id: "x", kv_transfer_params: answer });
      },
      d1: () => jsonAnswer(200, { from: "d" }),
    });
    const r = router([state(moriioP("READ"))], [state(moriioD("READ"))]);
    await drain((await r.handle(routingRequest(body), exec, signal())).body);
    const [pc, dc] = exec.calls;
    assert.ok(dc!.at >= pDoneAt, "D only after P answered");
    const pk = kvp(pc!);
    const dk = kvp(dc!);
    assert.match(String(pk.transfer_id), TX_ID);
    assert.equal(dk.transfer_id, pk.transfer_id, "the same transfer_id on both halves");
    for (const [k, v] of Object.entries(prefillAddress)) assert.deepEqual(pk[k], v, `P ${k}`);
    assert.equal(pc!.body.max_tokens, 1);
    assert.equal(pc!.body.stream, false);
    const decodeExpect = {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: "10.1.1.1:6301",
      remote_block_ids: [[4, 5, 6]],
      remote_host: "10.1.1.1",
      remote_port: 8100,
      remote_handshake_port: 6301,
      remote_notify_port: 61005,
      remote_dp_size: 1,
      remote_tp_size: 8,
    };
    for (const [k, v] of Object.entries(decodeExpect)) assert.deepEqual(dk[k], v, `D ${k}`);
    assert.equal(dc!.body.max_tokens, 20, "D keeps the client's limit");
    // Two requests, two ids.
    await drain((await r.handle(routingRequest(body), exec, signal())).body);
    assert.notEqual(kvp(exec.calls[2]!).transfer_id, pk.transfer_id);
  });

  test("WRITE: both halves at once, D's engine and block ids null; P with DP ranks is pinned", async () => {
    // "Both halves at once" is an ordering, not a duration: P answers only once D has been
    // sent (or after 5 s), and records whether D had been. A router that waits for P's answer
    // before sending D sees P answer with D unsent. (A wall-time bound, |P.at − D.at| < 20 ms,
    // failed on a loaded machine.)
    const dSentWhenPAnswered: boolean[] = [];
    const exec: FakeExecutor = new FakeExecutor({
      p1: async (c) => {
        const nth = exec.to("p1").length;
        const dSent = () => exec.to("d1").length >= nth;
        for (const t0 = Date.now(); !dSent() && Date.now() - t0 < 5000; ) await delay(5, c.opts.signal);
        dSentWhenPAnswered.push(dSent());
        return jsonAnswer(200, { id: "x" }); // WRITE: P's answer carries nothing D needs
      },
      d1: async (c) => {
        await delay(40, c.opts.signal);
        return jsonAnswer(200, { from: "d" });
      },
    });
    // One API server over 2 DP ranks (no dpRank in the record).
    const p = state(moriioP("WRITE", { dpSize: 2, dpRank: undefined }));
    const r = router([p], [state(moriioD("WRITE"))]);
    for (let i = 0; i < 2; i++) await drain((await r.handle(routingRequest(body), exec, signal())).body);
    const pcs = exec.to("p1");
    const dcs = exec.to("d1");
    assert.equal(pcs.length, 2);
    for (let i = 0; i < 2; i++) {
      const pc = pcs[i]!;
      const dc = dcs[i]!;
      assert.equal(dSentWhenPAnswered[i], true, "D sent before P answered (P and D sent together)");
      const pk = kvp(pc);
      const dk = kvp(dc);
      assert.match(String(pk.transfer_id), TX_ID);
      assert.equal(dk.transfer_id, pk.transfer_id);
      for (const [k, v] of Object.entries(prefillAddress)) assert.deepEqual(pk[k], v, `P ${k}`);
      assert.equal(dk.remote_engine_id, null);
      assert.equal(dk.remote_block_ids, null);
      assert.equal(dk.do_remote_prefill, true);
      assert.equal(dk.remote_host, "10.1.1.1");
      assert.equal(dk.remote_port, 8100);
      assert.equal(dk.remote_notify_port, 61005, "D notifies P of its blocks on P's notify port");
      assert.equal(dk.remote_dp_size, 2);
      // examples/online_serving/disaggregated_serving/moriio_toy_proxy_server.py
      // @ faa928062b1f51cb984883e56b18f74f0d51bcc6: X-data-parallel-rank to P when
      // dp_size > 1, and the same rank as D's remote_dp_rank.
      assert.equal(pc.opts.headers?.["x-data-parallel-rank"], String(i));
      assert.equal(dk.remote_dp_rank, i);
      assert.equal(dc.opts.headers?.["x-data-parallel-rank"], undefined, "D is not pinned");
    }
  });

  test("a WRITE prefill worker is never paired with a READ decode worker", async () => {
    const exec = new FakeExecutor({});
    const r = router([state(moriioP("WRITE"))], [state(moriioD("READ"))]);
    await assert.rejects(r.handle(routingRequest(body), exec, signal()), { status: 503 });
    assert.equal(exec.calls.length, 0);
  });

  test("the proxy registration's transfer_mode reaches the record; a URL request_address keeps host:port", () => {
    // The toy proxy reads `transfer_mode` from each registration and refuses mixed modes
    // (moriio_toy_proxy_server.py @ faa9280, _append_whole_dict_unique).
    const reg = parseMoriioRegistration({
      type: "register",
      role: "D",
      request_address: "http://10.0.0.2:9000/v1/completions",
      handshake_port: 8001,
      notify_port: 8002,
      dp_size: 1,
      tp_size: 1,
      transfer_mode: "WRITE",
    });
    assert.equal(reg?.transferMode, "WRITE");
    assert.equal(reg?.httpAddress, "10.0.0.2:9000");
    assert.equal(reg?.host, "10.0.0.2");
    // vllm-project/router src/routers/http/moriio_service_discovery.rs @ 0f1200dd441097be05a200c532b17825f90acbe0:
    // a "HELLO" message with a role is a registration too (test_handle_registration_sets_global_mode).
    const hello = parseMoriioRegistration({
      type: "HELLO",
      role: "P",
      request_address: "http://1.2.3.4:8000/v1/completions",
      handshake_port: 8001,
      notify_port: 8002,
      dp_size: 1,
      tp_size: 1,
      transfer_mode: "READ",
    });
    assert.equal(hello?.role, "prefill");
    assert.equal(hello?.httpAddress, "1.2.3.4:8000");
  });
});

// vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_utils.py
// @ e7ad92e5308e67c9657fc06f351ff4326848f130: GET /query answers dict[int, EngineEntry]
// (dp rank → {engine_id, worker_addr: {tp_rank: {pp_rank: addr}}}).
// examples/online_serving/disaggregated_serving/mooncake_connector/mooncake_connector_proxy.py
// @ f1b4b2802cde3faa894510acb65beead29f57597: the proxy cycles over each P's DP ranks, sends P
// `X-data-parallel-rank: <rank>` and gives D that rank's engine id as remote_engine_id with
// remote_dp_rank; vllm/entrypoints/openai/engine/serving.py @ 619e4b31da7791a6ea4f6724fe45b54556b5a8fa
// `_get_data_parallel_rank` reads the header.
describe("Mooncake: a prefill worker with several DP ranks (issue #16)", () => {
  let bootstrap: http.Server;
  let port = 0;
  const query = {
    "0": { engine_id: "eng-a_dp0", worker_addr: { "0": { "0": "10.1.1.1:17000" } } },
    "1": { engine_id: "eng-a_dp1", worker_addr: { "0": { "0": "10.1.1.1:17001" } } },
  };
  before(async () => {
    bootstrap = http.createServer((req, res) => {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(req.url === "/query" ? query : {}));
    });
    await new Promise<void>((r) => bootstrap.listen(0, "127.0.0.1", () => r()));
    port = (bootstrap.address() as { port: number }).port;
  });
  after(() => bootstrap.close());

  const mc = (id: string, role: "prefill" | "decode", over: Partial<WorkerRecord> = {}) =>
    state(record(id, role, { kind: "mooncake", bootstrapHost: "127.0.0.1", bootstrapPort: port }, over));

  test("each request is pinned to one rank, and D gets that rank's engine id", async () => {
    const exec = new FakeExecutor({
      p1: () => jsonAnswer(200, {}),
      d1: () => jsonAnswer(200, { from: "d" }),
    });
    const r = router([mc("p1", "prefill", { dpSize: 2, dpRank: undefined })], [mc("d1", "decode")]);
    for (let i = 0; i < 4; i++) await drain((await r.handle(routingRequest(body), exec, signal())).body);
    const pairs = exec.to("p1").map((pc, i) => {
      const dc = exec.to("d1")[i]!;
      return [pc.opts.headers?.["x-data-parallel-rank"], kvp(dc).remote_engine_id, kvp(dc).remote_dp_rank];
    });
    assert.deepEqual(pairs, [
      ["0", "eng-a_dp0", 0],
      ["1", "eng-a_dp1", 1],
      ["0", "eng-a_dp0", 0],
      ["1", "eng-a_dp1", 1],
    ]);

    // A record for one rank (its own API server) is not pinned; D gets its rank's engine.
    const one = new FakeExecutor({
      p2: () => jsonAnswer(200, {}),
      d1: () => jsonAnswer(200, { from: "d" }),
    });
    const r1 = router([mc("p2", "prefill", { dpSize: 2, dpRank: 1 })], [mc("d1", "decode")]);
    await drain((await r1.handle(routingRequest(body), one, signal())).body);
    assert.equal(one.to("p2")[0]!.opts.headers?.["x-data-parallel-rank"], undefined);
    assert.equal(kvp(one.to("d1")[0]!).remote_engine_id, "eng-a_dp1");
    assert.equal(kvp(one.to("d1")[0]!).remote_dp_rank, 1);
  });

  test("/query shapes: current rank → entry, older engine id → ranks", () => {
    assert.equal(engineIdFromQuery(query, 1), "eng-a_dp1");
    assert.equal(engineIdFromQuery(query, 0), "eng-a_dp0");
    // The older answer the proxy @ f1b4b28 iterates as `for engine_id, engine_entry in data.items()`.
    assert.equal(engineIdFromQuery({ "eng-b": { "0": {}, "1": {} } }, 1), "eng-b");
  });
});

// sgl-project/sglang sgl-model-gateway/src/routers/http/pd_router.rs
// @ ca7a2204571486d6b4282fefe4f6af1c25e3acf2: get_chat_batch_size (n > 1 → n),
// get_completion_batch_size (a list prompt → its length), inject_bootstrap_into_value (lists
// of host, port and an independent generate_room_id() per item; scalars otherwise).
describe("SGLang: batched requests carry per-item bootstrap lists (issue #16)", () => {
  const P = record("p1", "prefill", { kind: "sglang", bootstrapHost: "10.1.1.1", bootstrapPort: 9001 });
  const D = record("d1", "decode", { kind: "sglang" });
  const bodies = (b: Record<string, unknown>) => {
    const proto = pdProtocols.sglang;
    if (proto.mode !== "concurrent") throw new Error("sglang is concurrent");
    return proto.bodies({ body: b, requestId: "r", prefill: P, decode: D });
  };

  test("a completion with a list of prompts: one host, port and room per prompt", () => {
    const { prefill, decode } = bodies({ model: "m", prompt: ["a", "b", "c"], max_tokens: 4 });
    assert.deepEqual(prefill, decode, "P and D agree on every item's room");
    assert.deepEqual(prefill.bootstrap_host, ["10.1.1.1", "10.1.1.1", "10.1.1.1"]);
    assert.deepEqual(prefill.bootstrap_port, [9001, 9001, 9001]);
    const rooms = prefill.bootstrap_room as number[];
    assert.equal(rooms.length, 3);
    assert.ok(rooms.every((r) => Number.isSafeInteger(r) && r >= 0));
    assert.equal(new Set(rooms).size, 3, "independent rooms");
  });

  test("a chat with n > 1: n items; single items keep scalars", () => {
    const { prefill: batched } = bodies({ ...body, n: 2 });
    assert.equal((batched.bootstrap_room as number[]).length, 2);
    assert.deepEqual(batched.bootstrap_port, [9001, 9001]);
    // A string prompt, one prompt's token ids, n = 1: one item.
    for (const b of [
      { model: "m", prompt: "x" },
      { model: "m", prompt: [1, 2, 3] },
      { ...body, n: 1 },
      body,
    ]) {
      const { prefill } = bodies(b);
      assert.equal(typeof prefill.bootstrap_room, "number", JSON.stringify(b));
      assert.equal(prefill.bootstrap_host, "10.1.1.1");
    }
  });
});
