/**
 * A non-streamed answer whose head came over NATS but whose body had not when the broker went
 * away: nothing of it has reached the client (the server relays non-streamed answers whole),
 * so the executor sends the request again after the reconnect instead of failing it
 * (issue #17 item 11: 0 failed of the requests not yet streaming). Real nats-server, a real
 * agent, and an engine that answers its head at once and its body a second later.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import type { WorkerState } from "../../../src/router/types.ts";
import { type NatsRequestAgent, startRequestAgent } from "../../../src/transport/nats/agent.ts";
import { NatsRequestExecutor } from "../../../src/transport/nats/client.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { waitUntil } from "../../helpers/wait.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
const MODEL = "slow-body";

let nats: NatsServerHandle;
let engine: Server;
let engineUrl: string;
let requests = 0;
let ncAgent: NatsConnection;
let ncClient: NatsConnection;
let agent: NatsRequestAgent;
let nexec: NatsRequestExecutor;
let worker: WorkerState;

before(async () => {
  engine = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      if (req.method === "GET") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ object: "list", data: [{ id: MODEL }] }));
        return;
      }
      const n = ++requests;
      // The head leaves at once, the body a second later.
      res.writeHead(200, { "content-type": "application/json" });
      res.flushHeaders();
      setTimeout(
        () => res.end(JSON.stringify({ id: `cmpl-${n}`, choices: [{ index: 0, text: "whole" }] })),
        1000,
      );
    });
  });
  await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
  engineUrl = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
  nats = await startNats();
  ncAgent = await connectNats({ url: nats.url, name: "agent" });
  ncClient = await connectNats({ url: nats.url, name: "server" });
  agent = await startRequestAgent({ nc: ncAgent, engineUrl, model: MODEL, workerId: "w1" });
  nexec = new NatsRequestExecutor({ nc: ncClient, pingMs: 200, acceptTimeoutMs: 500, reconnectWaitMs: 8000 });
  const record = mixedRecord({ model: MODEL, id: "w1", url: engineUrl, natsSubject: agent.subject });
  worker = { record, inFlight: 0, pendingPrefillTokens: 0, available: true };
});

after(async () => {
  nexec.close();
  await agent.close();
  await ncAgent.close();
  await ncClient.close();
  await nats.close();
  engine.closeAllConnections();
  engine.close();
});

test("a non-streamed answer cut between its head and its end is sent again, not failed", async () => {
  const pending = nexec.send(
    worker,
    "completion",
    { model: MODEL, prompt: "x", max_tokens: 4 },
    { signal: new AbortController().signal },
  );
  // The engine has the request and its head is on the way; the body is not.
  await waitUntil(() => requests === 1, 5000, "the engine got the request", 10);
  await new Promise((r) => setTimeout(r, 300));
  await nats.restart();
  const res = await pending;
  assert.equal(res.status, 200);
  const got = (await res.json()) as { id: string; choices: { text: string }[] };
  assert.equal(got.choices[0]?.text, "whole");
  assert.equal(requests, 2, "the request was sent again after the reconnect");
  assert.equal(got.id, "cmpl-2", "the answer is the second attempt's");
});
