/**
 * `infera server --otlp-endpoint`: a collector URL with a password must not travel on argv
 * (every user of the host reads it through ps and /proc/PID/cmdline). On the command line it is
 * refused, the refusal masked and naming the other ways; from INFERA_OTLP_ENDPOINT it is taken
 * and its userinfo reaches the collector as HTTP Basic auth. Headers such as a bearer token go in
 * OTEL_EXPORTER_OTLP_HEADERS, which the exporter reads itself
 * (@opentelemetry/otlp-exporter-base 0.301.2, src/platform/node/configuration/
 * otlp-node-http-env-configuration.ts `getStaticHeadersFromEnv`: OTEL_EXPORTER_OTLP_HEADERS, then
 * OTEL_EXPORTER_OTLP_TRACES_HEADERS over it, as `key=value` pairs with %-encoded values).
 * Real server processes, a real OTLP/HTTP receiver.
 */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { flagsToConfig } from "../../src/cli/server.ts";
import { resolveServerConfig } from "../../src/server/config.ts";
import { ConfigError } from "../../src/server/config-schema.ts";
import { stopChild } from "../../src/util/child-process.ts";
import { exitWithin, serverArgs, spawnInfera } from "../helpers/infera.ts";
import { type OtlpReceiver, startOtlpReceiver } from "../helpers/otlp-receiver.ts";
import { freePort } from "../helpers/ports.ts";
import { waitFor200 } from "../helpers/wait.ts";

let recv: OtlpReceiver;
before(async () => {
  recv = await startOtlpReceiver();
});
after(async () => {
  await recv?.close();
});

/** Without the INFERA_OTLP_ENDPOINT of the test's own environment, if any. */
const NO_ENV = { INFERA_OTLP_ENDPOINT: "", OTEL_EXPORTER_OTLP_HEADERS: "" };

test("a URL with a password on --otlp-endpoint is refused before the server starts, masked", async () => {
  const port = await freePort();
  const { proc, output } = spawnInfera(
    serverArgs(port, "--otlp-endpoint", "http://otel:s3cret@127.0.0.1:1"),
    {
      logLevel: "silent",
      env: NO_ENV,
    },
  );
  // A server that took the URL would listen for ever: give it a bounded time to exit.
  const code = await exitWithin(proc, 20_000);
  assert.equal(code, 2, output());
  assert.match(output(), /--otlp-endpoint http:\/\/otel:\*\*\*@127\.0\.0\.1:1.*carries a password/);
  assert.match(output(), /INFERA_OTLP_ENDPOINT/);
  assert.match(output(), /OTEL_EXPORTER_OTLP_HEADERS/);
  assert.ok(!output().includes("s3cret"), output());
});

test("the same URL from INFERA_OTLP_ENDPOINT is taken; OTEL_EXPORTER_OTLP_HEADERS reaches the collector", async () => {
  const port = await freePort();
  const endpoint = recv.url.replace("http://", "http://otel:s3cret@");
  const server = spawnInfera(serverArgs(port, "--scrape-interval", "0"), {
    logLevel: "silent",
    env: { INFERA_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_HEADERS: "x-collector-key=k%201" },
  });
  try {
    const base = `http://127.0.0.1:${port}`;
    await waitFor200(`${base}/health`, { timeoutMs: 30_000, what: "server /health", output: server.output });
    // No worker serves the model: a 404, but the request's trace is still exported.
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "nobody", messages: [{ role: "user", content: "hi" }] }),
    });
    await r.text();
    await recv.waitFor((s) => s.some((x) => x.name === "infera.request"));
  } finally {
    await stopChild(server.proc, 5000);
  }
  const req = recv.requests.find((q) => q.path === "/v1/traces");
  assert.ok(req, JSON.stringify(recv.requests));
  assert.equal(req.headers.authorization, `Basic ${Buffer.from("otel:s3cret").toString("base64")}`);
  assert.equal(req.headers["x-collector-key"], "k 1");
});

test("the flag layer refuses it; a config file's otlpEndpoint with a password is taken", () => {
  assert.throws(
    () => flagsToConfig({ otlpEndpoint: "https://:t0k@collector:4318" }),
    (e: unknown) => e instanceof ConfigError && !e.message.includes("t0k") && /--config file/.test(e.message),
  );
  assert.equal(
    flagsToConfig({ otlpEndpoint: "http://collector:4318" }).otlpEndpoint,
    "http://collector:4318",
  );
  const dir = mkdtempSync(join(tmpdir(), "otlp-"));
  const file = join(dir, "infera.yaml");
  writeFileSync(file, "otlpEndpoint: https://otel:s3cret@collector:4318\n", { mode: 0o600 });
  const cfg = resolveServerConfig(() => flagsToConfig({}), file, { env: {} });
  assert.equal(cfg.otlpEndpoint, "https://otel:s3cret@collector:4318");
});
