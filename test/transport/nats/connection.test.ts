import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Writable } from "node:stream";
import { after, test } from "node:test";
import { nkeys } from "@nats-io/transport-node";
import { type Logger, pino } from "pino";
import { Registry } from "prom-client";
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

/** A pino logger whose lines land in `lines` (JSON objects). */
function captureLogger(): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const dest = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split("\n")) if (l.trim()) lines.push(JSON.parse(l));
      cb();
    },
  });
  return { logger: pino({ level: "warn" }, dest), lines };
}

async function anonymousGauge(registry: Registry): Promise<number | undefined> {
  const m = await registry.getSingleMetric("infera_nats_anonymous")?.get();
  return m?.values[0]?.value;
}

// Issue #30 item 1: an unauthenticated client read every prompt on infera.req.> and nothing
// was logged. A broker that takes clients without auth now gets one loud warning per logger
// and infera_nats_anonymous = 1, unless --nats-allow-anonymous says it is intended.
test("a broker without auth: one warning per logger, the gauge at 1; --nats-allow-anonymous silences it", async () => {
  const s = await startNats();
  servers.push(s);
  const { logger, lines } = captureLogger();
  const registry = new Registry();
  const a = await connectNats({ url: s.url, logger, registry });
  const b = await connectNats({ url: s.url, logger, registry });
  const warned = lines.filter((l) => String(l.msg).includes("without authentication"));
  assert.equal(warned.length, 1, "warned once");
  assert.equal(await anonymousGauge(registry), 1);
  await a.close();
  await b.close();

  const quiet = captureLogger();
  const r2 = new Registry();
  const c = await connectNats({ url: s.url, logger: quiet.logger, registry: r2, allowAnonymous: true });
  assert.equal(quiet.lines.length, 0);
  assert.equal(await anonymousGauge(r2), 1, "the gauge still says what is true");
  await c.close();
});

test("credentials the broker requires: no warning, the gauge at 0", async () => {
  const s = await startNats({ user: "u", password: "pw" });
  servers.push(s);
  const { logger, lines } = captureLogger();
  const registry = new Registry();
  const nc = await connectNats({ url: s.url, user: "u", password: "pw", logger, registry });
  assert.equal(lines.length, 0);
  assert.equal(await anonymousGauge(registry), 0);
  await nc.close();
});
