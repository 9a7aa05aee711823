/**
 * The MoRIIO proxy-registration ROUTER socket: MoRIIO sims register over ZMQ DEALER, the
 * server follows them as discovery and serves PD requests through them; a worker that stops
 * pinging is removed.
 */
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, before, describe, test } from "node:test";
import { pack } from "msgpackr";
import OpenAI from "openai";
import { pino } from "pino";
import * as zmq from "zeromq";
import { createDiscoveryWatcher } from "../../src/discovery/index.ts";
import { MoriioProxyDiscovery, parseMoriioRegistration } from "../../src/discovery/moriio-proxy.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { createLogger } from "../../src/util/log.ts";
import { freePort } from "../helpers/ports.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { longPrompt, MODEL, promptSources, waitFor } from "../router/disagg/pd-cluster.ts";

test("registration messages: the current map, the older form, WRITE mode", () => {
  assert.deepEqual(
    parseMoriioRegistration({
      type: "P",
      http_address: "10.0.0.1:8100",
      zmq_address: "host:10.0.0.1,handshake:6301,notify:61005",
      dp_size: 2,
      tp_size: 8,
      transfer_mode: "READ",
    }),
    {
      role: "prefill",
      httpAddress: "10.0.0.1:8100",
      host: "10.0.0.1",
      handshakePort: 6301,
      notifyPort: 61005,
      dpSize: 2,
      tpSize: 8,
      transferMode: "READ",
    },
  );
  const old = parseMoriioRegistration({
    type: "register",
    role: "D",
    request_address: "http://10.0.0.2:8200",
    handshake_port: 6302,
    notify_port: 61006,
  });
  assert.equal(old?.role, "decode");
  assert.equal(old?.httpAddress, "10.0.0.2:8200");
  assert.equal(old?.host, "10.0.0.2");
  assert.equal(old?.handshakePort, 6302);
  assert.equal(parseMoriioRegistration({ type: "X", http_address: "a:1" }), null);
  assert.equal(parseMoriioRegistration([1, 2]), null);
  assert.equal(
    parseMoriioRegistration({ type: "D", http_address: "a:1", transfer_mode: "WRITE" })?.transferMode,
    "WRITE",
  );
});

test("--discovery moriio builds the proxy socket from the config's options", async () => {
  const logger = createLogger("test");
  logger.level = "silent";
  await assert.rejects(createDiscoveryWatcher({ kind: "moriio", options: {} }, logger), /options\.model/);
  const w = await createDiscoveryWatcher(
    { kind: "moriio", options: { model: "m", port: 0, staleMs: 5000 } },
    logger,
  );
  assert.ok(w instanceof MoriioProxyDiscovery);
  await w.start();
  const dealer = new zmq.Dealer({ linger: 0 });
  dealer.connect(`tcp://127.0.0.1:${w.port}`);
  await dealer.send(
    pack({
      type: "P",
      http_address: "127.0.0.1:9",
      zmq_address: "host:127.0.0.1,handshake:1,notify:2",
      dp_size: 1,
      tp_size: 1,
      transfer_mode: "READ",
    }),
  );
  await waitFor(async () => w.workers().length === 1, 3000, "the registration");
  assert.equal(w.workers()[0].role, "prefill");
  assert.equal(w.workers()[0].model, "m");
  dealer.close();
  await w.close();
});

test("a WRITE-mode registration becomes a record with connector.transferMode WRITE (issue #16)", async () => {
  // vLLM's MoRIIO default is WRITE (read_mode false); its proxies route such workers
  // concurrently (vllm-project/router src/routers/http/moriio_pd_router.rs @ a9e5c52,
  // process_write_mode). They used to be dropped here.
  const logger = createLogger("test");
  logger.level = "silent";
  const w = new MoriioProxyDiscovery({ port: 0, model: "m", staleMs: 5000, logger });
  await w.start();
  const dealer = new zmq.Dealer({ linger: 0 });
  dealer.connect(`tcp://127.0.0.1:${w.port}`);
  await dealer.send(
    pack({
      type: "register",
      role: "D",
      request_address: "http://127.0.0.1:9/v1/completions",
      handshake_port: 11,
      notify_port: 12,
      dp_size: 1,
      tp_size: 1,
      transfer_mode: "WRITE",
    }),
  );
  try {
    await waitFor(async () => w.workers().length === 1, 3000, "the registration");
    const rec = w.workers()[0]!;
    assert.equal(rec.role, "decode");
    assert.equal(rec.url, "http://127.0.0.1:9");
    assert.deepEqual(rec.connector, {
      kind: "moriio",
      bootstrapHost: "127.0.0.1",
      handshakePort: 11,
      notifyPort: 12,
      transferMode: "WRITE",
    });
  } finally {
    dealer.close();
    await w.close();
  }
});

test("a registration whose record fails the schema is skipped with one warning naming it", async () => {
  // Registrations are unauthenticated msgpack; the other backends (etcd, static, memory) pass
  // every record through validateWorkerRecord (src/discovery/schema.ts), this one did not, so
  // `dp_size: 0` or a port past 65535 reached the routers.
  const lines: Array<Record<string, unknown>> = [];
  const out = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split("\n")) if (l.trim()) lines.push(JSON.parse(l));
      cb();
    },
  });
  const w = new MoriioProxyDiscovery({
    port: 0,
    model: "m",
    staleMs: 5000,
    logger: pino({ level: "warn" }, out),
  });
  await w.start();
  const dealer = new zmq.Dealer({ linger: 0 });
  dealer.connect(`tcp://127.0.0.1:${w.port}`);
  const reg = (http: string, extra: Record<string, unknown>) =>
    pack({
      type: "P",
      http_address: http,
      zmq_address: "host:127.0.0.1,handshake:11,notify:12",
      dp_size: 1,
      tp_size: 1,
      ...extra,
    });
  try {
    // Re-sent like a real worker's pings: the warning must not repeat with them.
    for (let i = 0; i < 3; i++) {
      await dealer.send(reg("127.0.0.1:9001", { dp_size: 0 }));
      await dealer.send(reg("127.0.0.1:9002", { zmq_address: "host:127.0.0.1,handshake:70000,notify:12" }));
    }
    await dealer.send(reg("127.0.0.1:9003", {}));
    // One DEALER connection delivers in order: the valid one arrives after the invalid ones.
    await waitFor(async () => w.workers().length > 0, 3000, "the valid registration");
    assert.deepEqual(
      w.workers().map((r) => r.url),
      ["http://127.0.0.1:9003"],
    );
    const warns = lines.filter((l) => l.level === 40 && l.msg === "ignoring invalid worker record");
    assert.deepEqual(
      warns.map((l) => [l.key, l.error]),
      [
        ["moriio-prefill-127.0.0.1:9001", "dpSize: Number must be greater than or equal to 1"],
        [
          "moriio-prefill-127.0.0.1:9002",
          "connector.handshakePort: Number must be less than or equal to 65535",
        ],
      ],
    );
  } finally {
    dealer.close();
    await w.close();
  }
});

describe("MoRIIO workers register with the server's proxy socket", () => {
  let proxy: MoriioProxyDiscovery;
  let server: InferaServer;
  const sims: SimProcess[] = [];
  before(async () => {
    const logger = createLogger("test");
    logger.level = "silent";
    proxy = new MoriioProxyDiscovery({ port: 0, model: MODEL, staleMs: 1500, logger });
    await proxy.start();
    const sim = async (role: "prefill" | "decode") => {
      const port = await freePort();
      const extra = {
        proxy_ip: "127.0.0.1",
        proxy_ping_port: proxy.port,
        // The registration's http_address is `<host ip>:<http_port>`; vLLM reads http_port
        // from this config without a default (moriio_common.py MoRIIOConfig.from_vllm_config).
        http_port: port,
        handshake_port: await freePort(),
        notify_port: await freePort(),
        read_mode: true,
        sim_ping_interval_ms: 300,
      };
      const s = await startSim({
        model: MODEL,
        port,
        timeoutMs: 60_000,
        args: [
          "--role",
          role,
          "--kv-transfer-config",
          JSON.stringify({
            kv_connector: "MoRIIOConnector",
            kv_role: role === "prefill" ? "kv_producer" : "kv_consumer",
            kv_connector_extra_config: extra,
          }),
          "--speed",
          "20",
        ],
      });
      sims.push(s);
      return s;
    };
    await Promise.all([sim("prefill"), sim("decode")]);
    await waitFor(async () => proxy.workers().length === 2, 10_000, "both workers to register");
    server = await startServer({ port: 0, scrapeIntervalMs: 0 }, { discovery: proxy });
  });
  after(async () => {
    await server?.close();
    await Promise.all(sims.map((s) => s.stop()));
    await proxy?.close();
  });

  test("records carry role, URL and the MoRIIO ports; requests go disaggregated", async () => {
    const byRole = Object.fromEntries(proxy.workers().map((w) => [w.role, w]));
    assert.deepEqual(new Set(proxy.workers().map((w) => w.url)), new Set(sims.map((s) => s.url)));
    assert.equal(byRole.decode.connector.kind, "moriio");
    assert.ok(byRole.prefill.connector.handshakePort && byRole.prefill.connector.notifyPort);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: longPrompt("moriio-proxy") }],
      max_tokens: 6,
    });
    assert.equal(r.usage?.completion_tokens, 6);
    const d = sims.find((s) => s.url === byRole.decode.url)!;
    assert.ok((await promptSources(d)).external > 0, "D pulled P's KV");
  });

  test("a worker that stops pinging is removed", async () => {
    const d = sims.find((s) => proxy.workers().some((w) => w.role === "decode" && w.url === s.url))!;
    await d.stop();
    await waitFor(async () => proxy.workers().length === 1, 6000, "the silent worker to expire");
    assert.equal(proxy.workers()[0].role, "prefill");
  });
});
