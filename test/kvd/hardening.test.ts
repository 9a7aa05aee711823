/**
 * Issue #17 hardening of kvd: namespaces cannot alias through NUL, the TCP listener needs a
 * token (and refuses a non-loopback bind without one), and an oversized frame is answered
 * with a 413 before its connection is closed.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import net from "node:net";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { KvdClient, KvdRequestError } from "../../src/kvd/client.ts";
import { isLoopbackHost, type KvdDaemon, startKvd } from "../../src/kvd/daemon.ts";
import {
  encodeFrame,
  FLAG_ERROR,
  type Frame,
  FrameDecoder,
  HEADER_BYTES,
  Op,
} from "../../src/kvd/protocol.ts";
import { createLogger } from "../../src/util/log.ts";
import { bytesFor, MiB, startTestKvd, tempDir } from "./helpers.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

const rejectsWith = (status: number, code: string) => (e: unknown) => {
  assert.ok(e instanceof KvdRequestError, String(e));
  assert.equal(e.status, status, e.message);
  assert.equal(e.code, code, e.message);
  return true;
};

/** Sends `bytes` on a fresh connection; collects the frames the daemon answers until it closes. */
function exchange(
  connectTo: { path: string } | { port: number },
  bytes: Buffer,
): Promise<{ frames: Frame[]; closed: boolean }> {
  return new Promise((resolve) => {
    const s = "path" in connectTo ? net.connect(connectTo.path) : net.connect(connectTo.port, "127.0.0.1");
    s.on("connect", () => s.write(bytes));
    const dec = new FrameDecoder(64 * MiB, true);
    const frames: Frame[] = [];
    const t = setTimeout(() => {
      s.destroy();
      resolve({ frames, closed: false });
    }, 3000);
    s.on("data", (d: Buffer) => frames.push(...dec.push(d)));
    s.on("error", () => {});
    s.on("close", () => {
      clearTimeout(t);
      resolve({ frames, closed: true });
    });
  });
}

describe("kvd: NUL cannot alias namespaces", () => {
  const tmp = tempDir();
  let kvd: KvdDaemon;
  before(async () => {
    kvd = await startTestKvd(tmp.dir);
  });
  after(async () => {
    await kvd.close();
    tmp.cleanup();
  });

  it('namespace "a" cannot read namespace "a\\0b" by asking for key "b\\0c"', async () => {
    // The victim's namespace has a NUL in it: refused at HELLO, so it cannot exist at all.
    await assert.rejects(
      KvdClient.connect({ socketPath: kvd.socketPath, namespace: "a\u0000b", arena: false }),
      rejectsWith(400, "invalid_namespace"),
    );
    const unbound = await KvdClient.connect({ socketPath: kvd.socketPath, arena: false });
    const attacker = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "a", arena: false });
    try {
      // Nor through the per-request `ns` of an unbound connection, small or sunk (≥ 64 KiB) PUT.
      for (const size of [100, 256 * 1024]) {
        await assert.rejects(
          unbound.put([{ key: "c", data: bytesFor("secret", size) }], "a\u0000b"),
          rejectsWith(400, "invalid_meta"),
        );
      }
      // Had it been stored, this is the read that would have returned it.
      for (const op of ["getCopy", "exists", "delete"] as const) {
        await assert.rejects(attacker[op](["b\u0000c"]), rejectsWith(400, "invalid_meta"), op);
      }
      await assert.rejects(
        attacker.put([{ key: "b\u0000c", data: bytesFor("x", 256 * 1024) }]),
        rejectsWith(400, "invalid_meta"),
      );
      // The connections stay usable; ordinary keys still work.
      await attacker.put([{ key: "b", data: Buffer.from("mine") }]);
      assert.deepEqual(await attacker.getCopy(["b"]), [Buffer.from("mine")]);
    } finally {
      unbound.close();
      attacker.close();
    }
  });
});

describe("kvd: TCP needs a token", () => {
  const tmp = tempDir();
  const TOKEN = "s3cret-token";
  let kvd: KvdDaemon;
  before(async () => {
    kvd = await startTestKvd(tmp.dir, { tcp: { host: "127.0.0.1", port: 0 }, tcpToken: TOKEN });
  });
  after(async () => {
    await kvd.close();
    tmp.cleanup();
  });
  const tcp = () => ({ host: "127.0.0.1", port: kvd.tcpPort! });

  it("refuses a HELLO without the token or with a wrong one (401), serves the right one", async () => {
    await assert.rejects(
      KvdClient.connect({ tcp: tcp(), namespace: "t" }),
      rejectsWith(401, "invalid_token"),
    );
    await assert.rejects(
      KvdClient.connect({ tcp: tcp(), namespace: "t", token: "wrong" }),
      rejectsWith(401, "invalid_token"),
    );
    const c = await KvdClient.connect({ tcp: tcp(), namespace: "t", token: TOKEN });
    try {
      await c.put([{ key: "k", data: Buffer.from("v") }]);
      assert.deepEqual(await c.getCopy(["k"]), [Buffer.from("v")]);
    } finally {
      c.close();
    }
    // The Unix socket (guarded by its file mode) needs none.
    const u = await KvdClient.connect({ socketPath: kvd.socketPath, namespace: "t" });
    assert.equal((await u.getCopy(["k"]))[0]?.toString(), "v");
    u.close();
  });

  it("the Python client sends the token (argument or INFERA_KVD_TCP_TOKEN)", async () => {
    const script = [
      "import json, sys",
      `sys.path.insert(0, ${JSON.stringify(join(import.meta.dirname, "../../python"))})`,
      "from infera_kvd.client import KvdClient, PutItem",
      "from infera_kvd.protocol import KvdError",
      `tcp = ("127.0.0.1", ${kvd.tcpPort})`,
      "out = {}",
      "try:",
      "    KvdClient(tcp=tcp, namespace='py', token='wrong')",
      "    out['wrong'] = 'accepted'",
      "except KvdError as e:",
      "    out['wrong'] = [e.status, e.code]",
      "c = KvdClient(tcp=tcp, namespace='py')",
      "c.put([PutItem('k', b'from-python')])",
      "out['got'] = c.get_copy(['k'])[0].decode()",
      "print(json.dumps(out))",
    ].join("\n");
    // Asynchronously: the daemon runs in this process.
    const p = spawn(process.env.PYTHON ?? "python3", ["-c", script], {
      env: { ...process.env, INFERA_KVD_TCP_TOKEN: TOKEN },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const r = { stdout: "", stderr: "", status: null as number | null };
    p.stdout.on("data", (d: Buffer) => {
      r.stdout += d;
    });
    p.stderr.on("data", (d: Buffer) => {
      r.stderr += d;
    });
    const t = setTimeout(() => p.kill("SIGKILL"), 30_000);
    r.status = await new Promise<number | null>((resolve) => p.on("close", resolve));
    clearTimeout(t);
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout.trim()), { wrong: [401, "invalid_token"], got: "from-python" });
  });

  it("answers nothing but 401 to a request sent before HELLO, then closes; a big PUT is not stored", async () => {
    const get = Buffer.concat(encodeFrame(Op.GET, 0, 7, { ns: "t", keys: ["k"], copy: true }));
    const r = await exchange({ port: kvd.tcpPort! }, get);
    assert.equal(r.closed, true);
    assert.equal(r.frames.length, 1);
    assert.equal(r.frames[0]!.id, 7);
    assert.ok(r.frames[0]!.flags & FLAG_ERROR);
    assert.equal(r.frames[0]!.meta.status, 401);
    assert.equal(r.frames[0]!.data.length, 0);

    const put = Buffer.concat(
      encodeFrame(Op.PUT, 0, 8, { ns: "t", items: [{ key: "evil", size: MiB }] }, Buffer.alloc(MiB, 1)),
    );
    const p = await exchange({ port: kvd.tcpPort! }, put);
    // Refused at its header now: before HELLO a TCP frame may be 4 KiB at most (issue #30 item 4).
    assert.equal(p.frames[0]?.meta.status, 413);
    assert.equal(p.frames[0]?.meta.max_frame_bytes, 4096);
    assert.equal(kvd.store.l2.live("t\u0000evil"), undefined);
  });

  it("refuses to start on a non-loopback address without a token", async () => {
    for (const host of ["127.0.0.1", "::1", "localhost", "::ffff:127.0.0.2", "[::1]"])
      assert.equal(isLoopbackHost(host), true, host);
    for (const host of ["0.0.0.0", "::", "10.0.0.5", "example.com", "::ffff:10.0.0.1"])
      assert.equal(isLoopbackHost(host), false, host);
    const log = createLogger("kvd-test").child({}, { level: "silent" });
    await assert.rejects(
      startKvd({ tcp: { host: "0.0.0.0", port: 0 }, ramBytes: MiB, diskBytes: 0 }, log),
      /refusing to listen on 0\.0\.0\.0:0 without a token/,
    );
    const d = await startKvd(
      { tcp: { host: "0.0.0.0", port: 0 }, tcpToken: "t", ramBytes: MiB, diskBytes: 0 },
      log,
    );
    await d.close();
  });
});

describe("kvd: a frame over the configured size", () => {
  const tmp = tempDir();
  let kvd: KvdDaemon;
  before(async () => {
    kvd = await startTestKvd(tmp.dir, { maxFrameBytes: 4 * MiB });
  });
  after(async () => {
    await kvd.close();
    tmp.cleanup();
  });

  it("is answered 413 frame_too_large (its op and id, the limit) before the connection closes", async () => {
    const ok = Buffer.concat(encodeFrame(Op.EXISTS, 0, 1, { ns: "n", keys: ["x"] }));
    const huge = Buffer.concat(encodeFrame(Op.PUT, 0, 2, { ns: "n", items: [{ key: "k", size: 64 * MiB }] }));
    huge.writeUInt32LE(64 * MiB, 16); // declared; never sent
    assert.equal(huge.length, HEADER_BYTES + huge.readUInt32LE(12));
    const r = await exchange({ path: kvd.socketPath! }, Buffer.concat([ok, huge]));
    assert.equal(r.closed, true);
    assert.deepEqual(
      r.frames.map((f) => [f.id, f.op, f.meta.status ?? 200]),
      [
        [1, Op.EXISTS, 200],
        [2, Op.PUT, 413],
      ],
    );
    const last = r.frames[r.frames.length - 1]!;
    assert.equal((last.meta.error as { code?: string }).code, "frame_too_large");
    assert.equal(last.meta.max_frame_bytes, 4 * MiB);
  });
});
