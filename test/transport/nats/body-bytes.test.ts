/**
 * Over the NATS request plane a request body reaches the engine as the bytes the server holds
 * for it (src/transport/types.ts `setRawBody`/`rawBodyOf`), as over HTTP: the client's own bytes
 * in mixed mode, and for a PD half those bytes with the protocol's fields appended. The client
 * body below is one that JSON.parse + JSON.stringify would change (spacing, `1.0`, `1e0`, key
 * order, a duplicate key, an integer past 2^53), so a re-serialisation anywhere on the way (the
 * NATS client, the agent) fails the byte comparison. A real nats-server, the real agent, and an
 * HTTP capture server standing in for the engine.
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { ConnectorInfo } from "../../../src/discovery/types.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { type NatsRequestAgent, startRequestAgent } from "../../../src/transport/nats/agent.ts";
import { NatsRequestExecutor } from "../../../src/transport/nats/client.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { type RequestExecutor, setRawBody } from "../../../src/transport/types.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { firstPairRouter, record, routingRequest, state } from "../../router/disagg/fixtures.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

/** What JSON.stringify(JSON.parse(x)) would not give back: every line of it changes. */
const COMPLETION_TEXT =
  '{ "prompt": "bytes", "model": "m",\n' +
  '  "temperature": 1.0, "top_p": 1e0, "max_tokens": 4, "max_tokens": 3,\n' +
  '  "vendor_field": {"z": 1, "a": [1.50, 12345678901234567890]} }\n';

const CHAT_TEXT =
  '{ "model": "m", "stream": false, "messages": [ {"role": "user", "content": "hi \\u00e9"} ],\n' +
  '  "temperature": 1.0, "max_tokens": 50, "big": 12345678901234567890,\n' +
  '  "kv_transfer_params": {"infera_retention": "short"} }\n';

let nats: NatsServerHandle;
let nc: NatsConnection;
let engine: http.Server;
let engineUrl = "";
let agent: NatsRequestAgent;
/** Bodies the engine received, in order. */
const received: Buffer[] = [];
/** The request paths the engine saw, in order. */
const paths: string[] = [];

before(async () => {
  nats = await startNats();
  nc = await connectNats({ url: nats.url });
  engine = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    paths.push(req.url ?? "");
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      received.push(body);
      const parsed = JSON.parse(body.toString()) as Record<string, unknown>;
      const kv = parsed.kv_transfer_params as Record<string, unknown> | undefined;
      res.setHeader("content-type", "application/json");
      // A nixl prefill half asks to be decoded remotely; its answer carries the blocks.
      const answer =
        kv?.do_remote_decode === true
          ? { id: "p", kv_transfer_params: { do_remote_prefill: true, remote_block_ids: [7] } }
          : {
              id: "x",
              object: "text_completion",
              model: "m",
              choices: [{ index: 0, text: "ok", finish_reason: "length" }],
              usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
            };
      res.end(JSON.stringify(answer));
    });
  });
  await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
  engineUrl = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
  agent = await startRequestAgent({ nc, engineUrl, model: "m", workerId: "w1" });
});

after(async () => {
  await agent.close();
  await new Promise<void>((r) => engine.close(() => r()));
  await nc.close();
  await nats.close();
});

test("mixed mode: the client's bytes reach the engine over NATS byte for byte", async () => {
  const rec = mixedRecord({ id: "w1", model: "m", url: "http://127.0.0.1:9", natsSubject: agent.subject });
  const server: InferaServer = await startServer(
    { port: 0, scrapeIntervalMs: 0, nats: { url: nats.url } },
    { discovery: new MemoryDiscovery([rec]) },
  );
  try {
    assert.equal(server.config.requestPlane, "nats");
    received.length = 0;
    const r = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: COMPLETION_TEXT,
    });
    assert.equal(r.status, 200, await r.clone().text());
    await r.arrayBuffer();
    assert.equal(received.length, 1);
    assert.equal(received[0]!.toString(), COMPLETION_TEXT);
  } finally {
    await server.close();
  }
});

// Issue #30 item 5: undici's Pool takes an origin only; an engine URL with a path (an engine
// behind a path-rewriting gateway) threw UND_ERR_INVALID_ARG at the agent's start.
test("an agent whose engine URL has a path sends under that path", async () => {
  const prefixed = await startRequestAgent({
    nc,
    engineUrl: `${engineUrl}/team-a/m/`,
    model: "m",
    workerId: "w-prefix",
  });
  const rec = mixedRecord({
    id: "w-prefix",
    model: "m",
    url: "http://127.0.0.1:9",
    natsSubject: prefixed.subject,
  });
  const server: InferaServer = await startServer(
    { port: 0, scrapeIntervalMs: 0, nats: { url: nats.url } },
    { discovery: new MemoryDiscovery([rec]) },
  );
  try {
    paths.length = 0;
    const r = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: COMPLETION_TEXT,
    });
    assert.equal(r.status, 200, await r.clone().text());
    await r.arrayBuffer();
    assert.deepEqual(paths, ["/team-a/m/v1/completions"]);
  } finally {
    await server.close();
    await prefixed.close();
  }
});

/** Runs one nixl PD request with both halves on the agent's worker; returns [prefill, decode] bytes. */
async function pdHalves(exec: RequestExecutor): Promise<[Buffer, Buffer]> {
  const c: ConnectorInfo = { kind: "nixl", bootstrapHost: "127.0.0.1", bootstrapPort: 9 };
  // Unreachable URLs: over NATS only the subject serves them.
  const over = exec instanceof HttpExecutor ? { url: engineUrl } : { url: "http://127.0.0.1:9" };
  const p = state(record("p1", "prefill", c, { ...over, natsSubject: agent.subject }));
  const d = state(record("d1", "decode", c, { ...over, natsSubject: agent.subject }));
  const router = firstPairRouter([p], [d]);
  const body = JSON.parse(CHAT_TEXT) as Record<string, unknown>;
  setRawBody(body, Buffer.from(CHAT_TEXT));
  received.length = 0;
  const up = await router.handle(routingRequest(body), exec, new AbortController().signal);
  for await (const _ of up.body);
  assert.equal(received.length, 2, "both halves sent");
  return [received[0]!, received[1]!];
}

test("a PD half over NATS is the client's bytes plus its appended fields, as over HTTP", async () => {
  const nexec = new NatsRequestExecutor({ nc });
  const [np, nd] = await pdHalves(nexec);
  nexec.close();
  const hexec = new HttpExecutor();
  const [hp, hd] = await pdHalves(hexec);
  await hexec.close();
  const head = CHAT_TEXT.slice(0, CHAT_TEXT.lastIndexOf("}"));
  for (const b of [np, nd]) assert.equal(b.subarray(0, Buffer.byteLength(head)).toString(), head);
  // The prefill half's fields were appended (last duplicate wins for the engine's parser).
  const pm = JSON.parse(np.toString()) as Record<string, unknown>;
  assert.equal(pm.max_tokens, 1);
  assert.equal(pm.stream, false);
  assert.equal((pm.kv_transfer_params as Record<string, unknown>).do_remote_decode, true);
  const dm = JSON.parse(nd.toString()) as Record<string, unknown>;
  assert.deepEqual((dm.kv_transfer_params as Record<string, unknown>).remote_block_ids, [7]);
  // The same bytes as the HTTP executor sends for the same halves.
  assert.equal(np.toString(), hp.toString());
  assert.equal(nd.toString(), hd.toString());
});

test("max_payload is checked against the bytes sent, not a re-serialisation", async () => {
  // A broker allowing 4 KiB, and a body whose own bytes (padded with spaces) are past it while
  // its re-serialisation would fit. Refused before anything is published.
  const never = { [Symbol.asyncIterator]: () => ({ next: () => new Promise<never>(() => {}) }) };
  const fake = { info: { max_payload: 4096 }, status: () => never } as unknown as NatsConnection;
  const exec = new NatsRequestExecutor({ nc: fake });
  const text = `{"model": "m", "prompt": "x"${" ".repeat(8000)}}`;
  const body = JSON.parse(text) as Record<string, unknown>;
  setRawBody(body, Buffer.from(text));
  const target = { record: mixedRecord({ id: "w1", model: "m", url: "http://127.0.0.1:9" }) };
  await assert.rejects(
    exec.send(target, "completion", body, { signal: new AbortController().signal }),
    (err: { status?: number; message?: string }) =>
      err.status === 413 && /8\d{3} bytes/.test(err.message ?? ""),
  );
  exec.close();
});
