/**
 * The connection options pass through to a real etcd: user/password auth, TLS with client
 * certificates, and an endpoint list whose first member is down.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { EtcdRegistrar } from "../../src/discovery/etcd-registrar.ts";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { type EtcdHandle, etcdctl, makeTlsFiles, startEtcd } from "../helpers/etcd.ts";
import { freePort } from "../helpers/ports.ts";
import { mixedRecord } from "../helpers/records.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

const rec = (id: string): WorkerRecord =>
  mixedRecord({ id, model: "m", url: "http://127.0.0.1:1", maxModelLen: 1024 });

async function waitFor(cond: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe("etcd connection options (real etcd)", () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  after(async () => {
    for (const c of cleanups.reverse()) await c();
  });
  const track = <T extends { close(): Promise<void> }>(x: T): T => {
    cleanups.push(() => x.close().catch(() => undefined));
    return x;
  };
  const started = async (h: Promise<EtcdHandle>) => {
    const etcd = await h;
    cleanups.push(() => etcd.dispose());
    return etcd;
  };

  it("user/password auth: works with the credentials, is refused without", async () => {
    const etcd = await started(startEtcd());
    etcdctl(etcd.endpoint, ["user", "add", "root", "--new-user-password=rootpw"]);
    etcdctl(etcd.endpoint, ["role", "add", "root"]);
    etcdctl(etcd.endpoint, ["user", "grant-role", "root", "root"]);
    etcdctl(etcd.endpoint, ["auth", "enable"]);
    const auth = { endpoints: [etcd.endpoint], prefix: "/auth", username: "root", password: "rootpw" };
    const reg = track(new EtcdRegistrar({ ...auth, leaseTtlSeconds: 5 }));
    await reg.register(rec("authed"));
    const watcher = track(new EtcdWatcher(auth));
    await watcher.start();
    assert.deepEqual(
      watcher.workers().map((r) => r.id),
      ["authed"],
    );
    const anon = track(new EtcdWatcher({ endpoints: [etcd.endpoint], prefix: "/auth", startTimeoutMs: 500 }));
    await assert.rejects(anon.start(), /could not list \/auth\/workers\//);
    const wrong = track(new EtcdRegistrar({ ...auth, password: "nope" }));
    await assert.rejects(wrong.register(rec("x")));
  });

  it("TLS with client certificates", async () => {
    const dir = mkdtempSync(join(tmpdir(), "infera-tls-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const tls = makeTlsFiles(dir);
    const etcd = await started(startEtcd({ tls: { ...tls, clientCertAuth: true } }));
    assert.match(etcd.endpoint, /^https:/);
    const conn = {
      endpoints: [etcd.endpoint],
      prefix: "/tls",
      caFile: tls.caFile,
      certFile: tls.clientCert,
      keyFile: tls.clientKey,
    };
    const watcher = track(new EtcdWatcher(conn));
    await watcher.start();
    const reg = track(new EtcdRegistrar({ ...conn, leaseTtlSeconds: 5 }));
    await reg.register(rec("tls-worker"));
    await waitFor(() => watcher.workers().some((r) => r.id === "tls-worker"), 1000, "tls-worker");
    // Without a client certificate the server refuses the handshake.
    const noCert = track(
      new EtcdWatcher({
        endpoints: [etcd.endpoint],
        prefix: "/tls",
        caFile: tls.caFile,
        startTimeoutMs: 1000,
      }),
    );
    await assert.rejects(noCert.start());
  });

  it("an endpoint list whose first member is down still registers and watches", async () => {
    const etcd = await started(startEtcd());
    const dead = `http://127.0.0.1:${await freePort()}`;
    const conn = { endpoints: [dead, etcd.endpoint], prefix: "/multi" };
    const watcher = track(new EtcdWatcher(conn));
    await watcher.start();
    const reg = track(new EtcdRegistrar({ ...conn, leaseTtlSeconds: 5 }));
    await reg.register(rec("multi"));
    await waitFor(() => watcher.workers().some((r) => r.id === "multi"), 3000, "multi");
  });
});
