import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";
import { nkeys } from "@nats-io/transport-node";
import { connectNats } from "../../../src/transport/nats/connection.ts";
import { type NatsServerHandle, startNats } from "../../helpers/nats.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
const servers: NatsServerHandle[] = [];
after(async () => {
  await Promise.all(servers.map((s) => s.close()));
});

async function roundTrip(nc: Awaited<ReturnType<typeof connectNats>>): Promise<string> {
  const sub = nc.subscribe("t.echo", {
    callback: (_e, m) => {
      m.respond(m.data);
    },
  });
  await nc.flush();
  const r = await nc.request("t.echo", "ping", { timeout: 2000 });
  sub.unsubscribe();
  await nc.close();
  return r.string();
}

test("token auth: right token connects, wrong token is refused", async () => {
  const s = await startNats({ token: "s3cret" });
  servers.push(s);
  assert.equal(await roundTrip(await connectNats({ url: s.url, token: "s3cret" })), "ping");
  await assert.rejects(connectNats({ url: s.url, token: "nope", maxReconnectAttempts: 0 }));
});

test("user/password auth", async () => {
  const s = await startNats({ user: "infera", password: "pw" });
  servers.push(s);
  assert.equal(await roundTrip(await connectNats({ url: s.url, user: "infera", password: "pw" })), "ping");
  await assert.rejects(connectNats({ url: s.url, user: "infera", password: "bad", maxReconnectAttempts: 0 }));
});

test("nkey auth from a seed file", async () => {
  const kp = nkeys.createUser();
  const s = await startNats({ nkeyPublic: kp.getPublicKey() });
  servers.push(s);
  const seedFile = join(s.dir, "user.nk");
  writeFileSync(seedFile, new TextDecoder().decode(kp.getSeed()));
  assert.equal(await roundTrip(await connectNats({ url: s.url, nkeySeedFile: seedFile })), "ping");
  await assert.rejects(connectNats({ url: s.url, maxReconnectAttempts: 0 }));
});

test("TLS with a private CA", async () => {
  const s = await startNats({ tls: true });
  servers.push(s);
  assert.match(s.url, /^tls:/);
  const nc = await connectNats({ url: s.url, tls: { caFile: s.tls!.caFile } });
  assert.equal(await roundTrip(nc), "ping");
  // Without the CA the server's certificate is not trusted.
  await assert.rejects(connectNats({ url: s.url, maxReconnectAttempts: 0 }));
});

test("mutual TLS: a client certificate from the CA gets in, none is refused", async () => {
  const s = await startNats({ tls: true, tlsVerify: true });
  servers.push(s);
  const t = s.tls!;
  const nc = await connectNats({
    url: s.url,
    tls: { caFile: t.caFile, certFile: t.clientCertFile, keyFile: t.clientKeyFile },
  });
  assert.equal(await roundTrip(nc), "ping");
  await assert.rejects(connectNats({ url: s.url, tls: { caFile: t.caFile }, maxReconnectAttempts: 0 }));
});
