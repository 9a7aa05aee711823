import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer, type Server } from "node:net";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { freePort } from "../../helpers/ports.ts";

const BIN = fileURLToPath(new URL("../../../bin/infera-sim.js", import.meta.url));

describe("sim start-up failure", () => {
  for (const which of ["http", "connector"] as const)
    it(`a port in use (${which}) makes the process exit 1 at once, with KV events and HTTP already bound`, async () => {
      const blocker: Server = createServer();
      await new Promise<void>((r) => blocker.listen(0, "127.0.0.1", r));
      const taken = (blocker.address() as { port: number }).port;
      const kvPort = await freePort();
      // "connector": a Mooncake prefill worker whose bootstrap port is taken, which fails after
      // the KV publisher and the HTTP server are up.
      const port = which === "http" ? taken : await freePort();
      const pd =
        which === "http"
          ? []
          : [
              "--role",
              "prefill",
              "--connector",
              "mooncake",
              "--kv-transfer-config",
              JSON.stringify({
                kv_connector: "MooncakeConnector",
                kv_role: "kv_producer",
                kv_connector_extra_config: { bootstrap_port: taken },
              }),
            ];
      const child = spawn(
        process.execPath,
        [
          BIN,
          "serve",
          "m",
          "--host",
          "127.0.0.1",
          "--port",
          String(port),
          "--kv-events-config",
          JSON.stringify({
            enable_kv_cache_events: true,
            publisher: "zmq",
            endpoint: `tcp://127.0.0.1:${kvPort}`,
          }),
          ...pd,
        ],
        { stdio: ["ignore", "pipe", "pipe"] },
      );
      let out = "";
      child.stdout.on("data", (b: Buffer) => {
        out += b.toString();
      });
      child.stderr.on("data", (b: Buffer) => {
        out += b.toString();
      });
      const started = Date.now();
      const code = await new Promise<number | null>((resolve) => {
        const t = setTimeout(() => {
          child.kill("SIGKILL");
          resolve(null);
        }, 15_000);
        child.once("exit", (c) => {
          clearTimeout(t);
          resolve(c);
        });
      });
      blocker.close();
      assert.equal(code, 1, `exit code (output: ${out.slice(-500)})`);
      assert.match(out, /EADDRINUSE/);
      assert.match(out, /sim engine failed to start/);
      assert.ok(Date.now() - started < 15_000);
    });
});
