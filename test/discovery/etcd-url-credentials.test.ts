/**
 * etcd endpoints with userinfo (issue #30 item 7): `http://user:pass@host:2379` went to gRPC
 * as a host name (`dns:user:pass@host`), failed, and the endpoint was logged with its password.
 * The userinfo is now etcd auth, and the host alone is dialled. Real etcd with auth enabled.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { createEtcdClient, splitEndpointCredentials } from "../../src/discovery/etcd-client.ts";
import { type EtcdHandle, etcdctl, startEtcd } from "../helpers/etcd.ts";

let etcd: EtcdHandle | undefined;
after(async () => {
  await etcd?.dispose();
});

test("splitEndpointCredentials takes the first userinfo and strips it from every endpoint", () => {
  assert.deepEqual(splitEndpointCredentials(["http://ro%3At:p%40ss@a:2379", "http://b:2379"]), {
    hosts: ["http://a:2379", "http://b:2379"],
    username: "ro:t",
    password: "p@ss",
  });
  assert.deepEqual(splitEndpointCredentials(["http://a:2379"]), {
    hosts: ["http://a:2379"],
    username: undefined,
    password: undefined,
  });
});

test("credentials in the endpoint URL authenticate to etcd", async () => {
  etcd = await startEtcd();
  etcdctl(etcd.endpoint, ["user", "add", "root", "--new-user-password=rootpw"]);
  etcdctl(etcd.endpoint, ["role", "add", "root"]);
  etcdctl(etcd.endpoint, ["user", "grant-role", "root", "root"]);
  etcdctl(etcd.endpoint, ["auth", "enable"]);
  const url = etcd.endpoint.replace("http://", "http://root:rootpw@");
  const client = createEtcdClient({ endpoints: [url], callTimeoutMs: 3000 });
  await client.put("/url-auth").value("ok");
  assert.equal(await client.get("/url-auth").string(), "ok");
  client.close();
  const wrong = createEtcdClient({
    endpoints: [etcd.endpoint.replace("http://", "http://root:nope@")],
    callTimeoutMs: 3000,
  });
  await assert.rejects(wrong.get("/url-auth").string());
  wrong.close();
});
