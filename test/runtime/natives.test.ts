/**
 * The native dependencies load and reach their native code under the Node that runs the tests
 * (Node 24): their binaries are tied to the Node that installed node_modules (usocket is
 * compiled for one ABI; zeromq, koffi and msgpackr-extract pick a prebuild), so an install made
 * by another major fails here by name rather than deep inside a kvd or ZMQ test.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import net from "node:net";
import { test } from "node:test";

const require = createRequire(import.meta.url);

test("runs on Node 24 or newer, as package.json's engines says", () => {
  const want = (require("../../package.json") as { engines: { node: string } }).engines.node;
  assert.equal(want, ">=24");
  assert.ok(Number(process.versions.node.split(".")[0]) >= 24, `running ${process.version}`);
});

test("zeromq: a PUSH/PULL pair moves a message through libzmq", async () => {
  const zmq = require("zeromq") as typeof import("zeromq");
  const pull = new zmq.Pull();
  const push = new zmq.Push();
  try {
    await pull.bind("tcp://127.0.0.1:*");
    push.connect(pull.lastEndpoint as string);
    await push.send("ping");
    const [msg] = await pull.receive();
    assert.equal(msg?.toString(), "ping");
  } finally {
    push.close();
    pull.close();
  }
});

test("koffi: calls into libc", () => {
  const koffi = require("koffi") as typeof import("koffi");
  const getpid = koffi.load("libc.so.6").func("int getpid()") as () => number;
  assert.equal(getpid(), process.pid);
});

test("usocket: its native wrapper talks over a Unix socket", async (t) => {
  const { USocket } = require("usocket") as {
    USocket: new (opts?: {
      path: string;
    }) => NodeJS.EventEmitter & {
      connect(opts: { path: string }, cb: () => void): void;
      write(data: { data: Buffer }): boolean;
      destroy(): void;
    };
  };
  const path = `${require("node:os").tmpdir()}/infera-natives-${process.pid}.sock`;
  const got = new Promise<string>((resolve) => {
    const srv = net.createServer((c) => c.once("data", (b) => resolve(b.toString())));
    srv.listen(path);
    t.after(() => srv.close());
  });
  await new Promise<void>((r) => setTimeout(r, 20));
  const u = new USocket();
  await new Promise<void>((resolve) => u.connect({ path }, resolve));
  u.write({ data: Buffer.from("pong") });
  assert.equal(await got, "pong");
  u.destroy();
});

test("msgpackr-extract: the native string extractor is what msgpackr uses", () => {
  const extract = require("msgpackr-extract") as { extractStrings?: unknown };
  assert.equal(typeof extract.extractStrings, "function");
  const { isNativeAccelerationEnabled } = require("msgpackr") as { isNativeAccelerationEnabled: boolean };
  assert.equal(isNativeAccelerationEnabled, true);
});

test("scripts/check-natives.mjs (run by postinstall and the image build) passes", () => {
  const out = execFileSync(process.execPath, ["scripts/check-natives.mjs"], { encoding: "utf8" });
  assert.equal(out.match(/ ok \(/g)?.length, 4, out);
});
