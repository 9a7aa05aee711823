/**
 * A big registry (issue #17): 10,000 worker records of ~4 KB (40 MB, ten times gRPC's
 * default 4 MiB message) in a real etcd; a fresh watcher must list every one of them and
 * follow a put after it. Before paging and the raised receive limit, ~1,000 such records left
 * a fresh server with 0 workers, retrying "etcd unreachable" forever. The figure is the list
 * time. INFERA_RELIABILITY_DISCOVERY_RECORDS overrides the count.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Etcd3 } from "etcd3";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { mixedRecord } from "../helpers/records.ts";
import { waitUntil } from "../helpers/wait.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
process.env.INFERA_LOG_LEVEL ??= "silent";

const N = Number(process.env.INFERA_RELIABILITY_DISCOVERY_RECORDS ?? 10_000);
let etcd: EtcdHandle | undefined;
let client: Etcd3 | undefined;
let watcher: EtcdWatcher | undefined;
after(async () => {
  await watcher?.close();
  client?.close();
  await etcd?.dispose();
  fileDone(import.meta.url);
});

test(`a fresh watcher lists ${N} records of ~4 KB from real etcd`, { timeout: 180_000 }, async () => {
  etcd = await startEtcd();
  client = new Etcd3({ hosts: etcd.endpoint });
  const prefix = "/rel-scale";
  const pad = "x".repeat(3700);
  const value = (i: number) => {
    const id = `w${String(i).padStart(6, "0")}`;
    return {
      key: `${prefix}/workers/m${i % 7}/${id}`,
      json: JSON.stringify(
        mixedRecord({
          id,
          model: `m${i % 7}`,
          url: `http://10.0.${i >> 8}.${i & 255}:8000`,
          labels: { pad },
        }),
      ),
    };
  };
  const t0 = Date.now();
  const BATCH = 200;
  for (let i = 0; i < N; i += BATCH) {
    await Promise.all(
      Array.from({ length: Math.min(BATCH, N - i) }, (_, k) => {
        const v = value(i + k);
        return client!.put(v.key).value(v.json);
      }),
    );
  }
  const putMs = Date.now() - t0;
  const bytes = value(0).json.length;

  watcher = new EtcdWatcher({ endpoints: [etcd.endpoint], prefix, startTimeoutMs: 60_000 });
  const t1 = Date.now();
  await watcher.start();
  const listMs = Date.now() - t1;
  const listed = watcher.workers().length;

  // Still following: one more record shows up through the watch.
  const extra = value(N);
  await client.put(extra.key).value(extra.json);
  await waitUntil(() => watcher!.workers().length === N + 1, 5000, "the watch to deliver one more record");

  const pass = record(
    import.meta.url,
    "etcd registry of 4 KB records",
    `${listed} of ${N} records (${bytes} B each, ${((N * bytes) / 1e6).toFixed(0)} MB) listed in ${listMs} ms by a fresh watcher (put in ${putMs} ms); watch follows after`,
    "all listed, not degraded",
    listed === N && !watcher.isDegraded(),
  );
  assert.ok(pass);
});
