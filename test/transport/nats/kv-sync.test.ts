/**
 * The NATS event plane's index sync (issue #28 item 3): a server whose start-up replay gets no
 * answer (no agent yet, or one too slow) holds the rank as `unknown`, routed as untracked, not as
 * an empty cache it trusts; the live batches it applies meanwhile rebuild it by the same rule as
 * the ZMQ plane (src/kv/rank-sync.ts). Real nats-server; the agent's side is played by hand with
 * its wire format (src/transport/nats/kv-wire.ts).
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { Packr } from "msgpackr";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { NatsKvIngest, workerKvSubject } from "../../../src/transport/nats/kv-ingest.ts";
import { encodeKvMessage, seqFrame } from "../../../src/transport/nats/kv-wire.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";
import { waitUntil } from "../../helpers/wait.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
const packr = new Packr({ useRecords: false });

let nats: NatsServerHandle;
let nc: NatsConnection;
before(async () => {
  nats = await startNats();
  nc = await connectNats({ url: nats.url });
});
after(async () => {
  await nc.close();
  await nats.close();
});

const stored = (hashes: number[], toks: number[]) => [
  "BlockStored",
  hashes,
  null,
  toks,
  4,
  null,
  "GPU",
  null,
  null,
  0,
];

test("a start-up replay nobody answers leaves the rank unknown (-1), not empty; an eviction rebuilds it", async () => {
  const rec = {
    id: "w",
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm" as const,
    role: "mixed" as const,
    url: "http://127.0.0.1:1",
    connector: { kind: "none" as const },
    blockSize: 4,
    kvEvents: { endpoint: "tcp://127.0.0.1:1", topic: "", framing: "seq" as const },
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
  };
  const ingest = new NatsKvIngest({ nc, watcher: new MemoryDiscovery([rec]), replayTimeoutMs: 300 });
  ingest.start();
  try {
    assert.equal(ingest.syncReport().syncing, 1);
    await ingest.synced();
    const index = ingest.index;
    assert.deepEqual(
      ingest.syncReport().ranks.map((r) => r.state),
      ["unknown"],
    );
    assert.equal(index.syncOf("w"), "unknown");
    // The engine ran before us (its seq is far from 0): what arrives is applied, not trusted yet.
    const toks = [1, 2, 3, 4, 5, 6, 7, 8];
    const subject = workerKvSubject(rec);
    nc.publish(subject, encodeKvMessage(seqFrame(500), packr.pack([1, [stored([11, 12], toks)], 0])));
    await waitUntil(() => index.blockCount("w") === 2, 5000, "live batch", 10);
    assert.deepEqual([...index.overlaps(toks, ["w"])], [-1]);
    assert.equal(ingest.subscriber("w")!.stats.resets, 0);
    // It evicts a block the index saw stored: older blocks went first, the view is whole again.
    nc.publish(
      subject,
      encodeKvMessage(seqFrame(501), packr.pack([2, [["BlockRemoved", [12], "GPU", 0]], 0])),
    );
    await waitUntil(() => index.syncOf("w") === "synced", 5000, "rebuilt", 10);
    assert.deepEqual([...index.overlaps(toks, ["w"])], [1]);
  } finally {
    await ingest.close();
  }
});
